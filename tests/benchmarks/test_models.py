"""Quick checks of the offline model builders and the long-prompt helper."""

from __future__ import annotations

import json

import pytest

from benchmarks.models.builders import build_tiny_llama, is_built


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny") / "model"
    return build_tiny_llama(out, seed=3, max_position_embeddings=300)


def test_tiny_files_and_config(tiny_dir):
    for name in ("config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json", "generation_config.json"):
        assert (tiny_dir / name).is_file(), name
    assert is_built(tiny_dir)
    cfg = json.loads((tiny_dir / "config.json").read_text())
    assert cfg["max_position_embeddings"] == 300
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["vocab_size"] == 512
    assert cfg["head_dim"] % 32 == 0  # vLLM CPU attention head sizes
    assert cfg["num_hidden_layers"] == 2


def test_tiny_tokenizer_round_trip(tiny_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    assert len(tok) == 512
    assert (tok.bos_token, tok.eos_token) == ("<|im_start|>", "<|im_end|>")
    text = "It was the best of times.\n  Tabs\tand ünïcödé, 2019 (GAO) 😀"
    ids = tok(text)["input_ids"]
    assert ids and max(ids) < 512
    assert tok.decode(ids) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}],
                                   add_generation_prompt=True, tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_tiny_deterministic_and_shared_tokenizer(tiny_dir, tmp_path):
    same = build_tiny_llama(tmp_path / "same", seed=3, max_position_embeddings=300)
    assert (same / "model.safetensors").read_bytes() == \
        (tiny_dir / "model.safetensors").read_bytes()
    assert (same / "tokenizer.json").read_bytes() == \
        (tiny_dir / "tokenizer.json").read_bytes()

    draft = build_tiny_llama(tmp_path / "draft", seed=4, num_layers=1,
                             tokenizer_dir=tiny_dir)
    assert (draft / "tokenizer.json").read_bytes() == \
        (tiny_dir / "tokenizer.json").read_bytes()
    assert (draft / "model.safetensors").read_bytes() != \
        (tiny_dir / "model.safetensors").read_bytes()
    # Idempotent: a second call returns the existing build untouched.
    mtime = (draft / "model.safetensors").stat().st_mtime_ns
    build_tiny_llama(tmp_path / "draft", seed=99)
    assert (draft / "model.safetensors").stat().st_mtime_ns == mtime


def test_tiny_greedy_output_is_varied(tiny_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    ids = tok("Once upon a time,", return_tensors="pt")["input_ids"]
    out = model.generate(ids, attention_mask=torch.ones_like(ids),
                         max_new_tokens=16, do_sample=False)
    new = out[0, ids.shape[1]:].tolist()
    assert len(set(new)) >= 8, new


def test_long_prompts_exact_lengths(long_prompts):
    lengths = [1, 100, 1000, 4000]
    ps = long_prompts(lengths)
    assert [len(p) for p in ps] == lengths
    assert all(isinstance(t, int) and 0 <= t < 512 for p in ps for t in p)
    assert long_prompts(lengths) == ps  # deterministic
    many = long_prompts(64, num_prompts=50, dataset="govreport")
    assert len(many) == 50 and all(len(p) == 64 for p in many)
    assert len({tuple(p) for p in many}) == 50  # distinct, also after wrap-around


def test_tiny_eagle3_head_layout(tiny_dir, tmp_path):
    from safetensors import safe_open

    from benchmarks.models.builders import build_tiny_eagle3

    head = build_tiny_eagle3(tmp_path / "eagle3", tiny_dir, max_position_embeddings=256)
    assert is_built(head)
    cfg = json.loads((head / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["num_hidden_layers"] == 1 and cfg["max_position_embeddings"] == 256
    assert cfg["draft_vocab_size"] == cfg["vocab_size"] == 512
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    hidden = cfg["hidden_size"]
    with safe_open(str(head / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert f.get_tensor("fc.weight").shape == (hidden, 3 * hidden)
        q = f.get_tensor("midlayer.self_attn.q_proj.weight")
        assert q.shape[1] == 2 * hidden
        assert f.get_tensor("d2t").shape == (512,)
    assert {"lm_head.weight", "norm.weight", "t2d", "midlayer.hidden_norm.weight"} <= names
    assert not any("embed_tokens" in n for n in names)


def test_tiny_eagle_head_layout(tiny_dir, tmp_path):
    """EAGLE-1: exactly the weights vLLM's EagleLlamaForCausalLM loads besides
    the target's embedding and lm_head, which it shares."""
    from safetensors import safe_open

    from benchmarks.models.builders import build_tiny_eagle

    head = build_tiny_eagle(tmp_path / "eagle", tiny_dir)
    assert is_built(head)
    cfg = json.loads((head / "config.json").read_text())
    # vLLM's method "eagle" turns this into EagleLlamaForCausalLM.
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["num_hidden_layers"] == 1 and cfg["max_position_embeddings"] == 2048
    hidden = cfg["hidden_size"]
    layer = "layers.0."
    with safe_open(str(head / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert f.get_tensor("fc.weight").shape == (hidden, 2 * hidden)
        assert f.get_tensor(layer + "self_attn.q_proj.weight").shape[1] == hidden
    projections = [f"self_attn.{p}_proj" for p in "qkvo"]
    projections += [f"mlp.{p}_proj" for p in ("gate", "up", "down")]
    expected = {layer + p for p in projections}
    expected |= {"fc", layer + "post_attention_layernorm"}
    assert names == {f"{name}.weight" for name in expected}


def test_fp8_copy_quantizes_the_linears_and_keeps_the_rest(tiny_dir, tmp_path):
    import torch
    from safetensors.torch import load_file

    from benchmarks.models.builders import FP8_LINEARS, build_fp8

    out = build_fp8(tiny_dir, tmp_path / "fp8")
    assert is_built(out)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"] == {"quant_method": "fp8",
                                          "activation_scheme": "dynamic"}
    src = load_file(str(tiny_dir / "model.safetensors"))
    got = load_file(str(out / "model.safetensors"))
    linears = [n for n in src if n.split(".")[-2] in FP8_LINEARS]
    # two layers of seven linears each
    assert len(linears) == 7 * cfg["num_hidden_layers"]
    for name, t in src.items():
        if name not in linears:
            assert torch.equal(got[name], t), name
            continue
        q, scale = got[name], got[name[:-len("weight")] + "weight_scale"]
        assert q.dtype == torch.float8_e4m3fn and q.shape == t.shape
        assert scale.dtype == torch.float32 and scale.dim() == 0
        # the largest magnitude maps to e4m3's largest value, 448
        assert q.to(torch.float32).abs().max().item() == 448.0
        back = q.to(torch.float32) * scale
        # e4m3 keeps 3 mantissa bits: half a step is 1/16 of a value, and
        # values below e4m3's smallest normal (2^-6 of the scale) round on a
        # fixed grid of 2^-9 of the scale
        err = (back - t.float()).abs()
        bound = torch.maximum(t.float().abs() / 16, scale * 2.0 ** -10)
        assert (err <= bound * 1.0001).all(), name
    assert len(got) == len(src) + len(linears)  # one scale per linear
    # built once: a second call leaves the files alone
    before = (out / "model.safetensors").stat().st_mtime_ns
    assert build_fp8(tiny_dir, out) == out
    assert (out / "model.safetensors").stat().st_mtime_ns == before


def test_fp8_copy_needs_a_built_checkpoint(tmp_path):
    from benchmarks.models.builders import build_fp8

    with pytest.raises(FileNotFoundError, match="no built checkpoint"):
        build_fp8(tmp_path / "missing", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_fp8_copy_refuses_a_sharded_checkpoint(tiny_dir, tmp_path):
    import shutil

    from benchmarks.models.builders import build_fp8

    sharded = tmp_path / "sharded"
    shutil.copytree(tiny_dir, sharded)
    (sharded / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(ValueError, match="sharded checkpoint"):
        build_fp8(sharded, tmp_path / "out")


def test_padded_tokenizer_knows_every_id_and_encodes_as_before(tiny_dir, tmp_path):
    """Dummy weights of a larger vocabulary emit ids past the tokenizer's:
    padded, each decodes to text through vLLM's incremental path (instead of
    stalling the API server), and no text encodes differently. A gap in the
    vocabulary is filled too, and a slow tokenizer's vocabulary file (which
    would disagree) is dropped."""
    import shutil

    import tokenizers
    from tokenizers import Tokenizer

    from benchmarks.models.builders import pad_tokenizer

    src = tmp_path / "src"
    shutil.copytree(tiny_dir, src)
    data = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    gap = max(data["model"]["vocab"], key=data["model"]["vocab"].get)
    data["model"]["vocab"][gap] = 600  # ids 511 and 512-599 unknown
    (src / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    (src / "vocab.json").write_text("{}")

    out = pad_tokenizer(src, tmp_path / "padded", 700)
    before = Tokenizer.from_file(str(src / "tokenizer.json"))
    after = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert after.get_vocab_size() == 700
    assert sorted(after.get_vocab(with_added_tokens=True).values()) == list(range(700))
    assert after.token_to_id(gap) == 600
    assert not (out / "vocab.json").exists()
    assert (out / "tokenizer_config.json").read_bytes() == \
        (tiny_dir / "tokenizer_config.json").read_bytes()
    text = "It was the best of times.\n  Tabs\tand ünïcödé, <id650> 2019 😀"
    assert after.encode(text).ids == before.encode(text).ids
    assert after.decode([511, 599, 699]) == " <id511> <id599> <id699>"
    stream = tokenizers.decoders.DecodeStream(ids=before.encode(text).ids,
                                              skip_special_tokens=True)
    steps = [stream.step(after, i) for i in (650, 5, 699)]
    assert (steps[0], steps[2]) == (" <id650>", " <id699>")
    # in place, once padded: the file is left as it is (os.replace would
    # give it a new inode)
    inode = (out / "tokenizer.json").stat().st_ino
    assert pad_tokenizer(out, out, 700) == out
    assert (out / "tokenizer.json").stat().st_ino == inode


def test_pad_tokenizer_pads_in_place_and_refuses_what_it_cannot_pad(tiny_dir,
                                                                    tmp_path):
    import shutil

    from tokenizers import Tokenizer

    from benchmarks.models.builders import pad_tokenizer

    here = tmp_path / "here"
    shutil.copytree(tiny_dir, here)
    assert pad_tokenizer(here, here, 520) == here
    assert Tokenizer.from_file(str(here / "tokenizer.json")).get_vocab_size() == 520
    with pytest.raises(ValueError, match="ids up to 519, more than a vocabulary of 3"):
        pad_tokenizer(here, tmp_path / "small", 300)
    # An added token past the vocabulary (as Llama 3's are): tokenizers
    # numbers it after the vocabulary on loading, so filling would move it.
    data = json.loads((here / "tokenizer.json").read_text(encoding="utf-8"))
    data["added_tokens"].append({**data["added_tokens"][0], "id": 520,
                                 "content": "<|late|>"})
    (here / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    late = Tokenizer.from_file(str(here / "tokenizer.json"))
    assert late.token_to_id("<|late|>") == 520
    with pytest.raises(ValueError, match=r"past the vocabulary \(ids 520–520\)"):
        pad_tokenizer(here, tmp_path / "late", 600)
    assert pad_tokenizer(here, tmp_path / "late", 521) == tmp_path / "late"
    (tmp_path / "tokenizer.json").write_text(json.dumps(
        {"model": {"type": "Unigram", "vocab": []}, "decoder": None}))
    with pytest.raises(ValueError, match="byte-level BPE"):
        pad_tokenizer(tmp_path, tmp_path / "out", 100)


def test_evaluation_metadata_says_a_draft_is_fp8(tiny_dir, tmp_path):
    from benchmarks.longinput.eval_longinput import model_info
    from benchmarks.models.builders import build_fp8

    fp8 = model_info(str(build_fp8(tiny_dir, tmp_path / "fp8")))
    assert fp8["quantization_config"]["quant_method"] == "fp8"
    assert "quantization_config" not in model_info(str(tiny_dir))
