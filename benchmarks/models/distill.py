"""Distil a small short-context draft from its target (knowledge distillation).

The draft is the target cut down to a few of its own decoder layers (by default
the first and the last), with the target's embedding, final norm and LM head
copied and frozen, so only the layers train. Training sequences are
``seq_len`` tokens long, so the draft never sees a longer context:

* windows of Python's documentation (``pydoc_corpus``), and
* sequence-level KD data: the target's greedy continuations of short excerpts
  of that text, bare or wrapped in the evaluation's summarization format or in
  the chat template. The draft then learns the target's own outputs, which are
  what it has to predict when drafting.

The loss on every token is KL(target || draft) over the full vocabulary
(word-level KD on both kinds of sequence).
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.longinput.inputs import SUMMARY_HEAD, SUMMARY_TAIL, encode

LAYER_PREFIX = "model.layers."
CHAT_QUESTION = "\n\nExplain the text above."
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "generation_config.json")


# --------------------------------------------------------------------------- #
# checkpoints
# --------------------------------------------------------------------------- #
def load_tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        tensors.update(load_file(path))
    return tensors


def draft_tensors(target: dict[str, torch.Tensor], layers: dict[str, torch.Tensor]):
    """The target's tensors outside its decoder layers, plus the draft's layers."""
    shared = {k: v for k, v in target.items() if not k.startswith(LAYER_PREFIX)}
    return {**shared, **layers}


def pick_layers(target: dict[str, torch.Tensor], layer_ids: list[int]):
    """The target's layers ``layer_ids``, renumbered 0, 1, ... for the draft."""
    picked = {}
    for new, old in enumerate(layer_ids):
        prefix = f"{LAYER_PREFIX}{old}."
        for key, value in target.items():
            if key.startswith(prefix):
                picked[f"{LAYER_PREFIX}{new}.{key[len(prefix):]}"] = value
    return picked


def draft_config(target_dir: Path, num_layers: int, dtype: str) -> dict:
    config = json.loads((Path(target_dir) / "config.json").read_text())
    config["num_hidden_layers"] = num_layers
    config["dtype"] = dtype
    config.pop("torch_dtype", None)
    return config


def save_draft(out_dir: Path, target_dir: Path, layers: dict[str, torch.Tensor],
               recipe: dict, dtype: torch.dtype) -> Path:
    """Write the draft as an HF checkpoint vLLM loads: target tensors outside
    the layers + ``layers``, the target's config with fewer layers, and its
    tokenizer files."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    tensors = draft_tensors(load_tensors(target_dir), layers)
    tensors = {k: v.to(dtype).contiguous() for k, v in tensors.items()}
    save_file(tensors, out_dir / "model.safetensors", metadata={"format": "pt"})
    num_layers = len({k.split(".")[2] for k in layers})
    config = draft_config(target_dir, num_layers, str(dtype).removeprefix("torch."))
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        if (Path(target_dir) / name).is_file():
            shutil.copy(Path(target_dir) / name, out_dir / name)
    (out_dir / "recipe.json").write_text(json.dumps(recipe, indent=2) + "\n")
    return out_dir


def build_student(target_dir: Path, layer_ids: list[int], device):
    """The untrained draft in fp32: only its decoder layers require grad."""
    from transformers import AutoConfig, LlamaForCausalLM

    target = load_tensors(target_dir)
    config = AutoConfig.from_pretrained(target_dir)
    config.num_hidden_layers = len(layer_ids)
    student = LlamaForCausalLM(config)
    state = draft_tensors(target, pick_layers(target, layer_ids))
    missing, unexpected = student.load_state_dict(
        {k: v.float() for k, v in state.items()}, strict=False
    )
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise RuntimeError(f"state dict mismatch: {missing=} {unexpected=}")
    for name, param in student.named_parameters():
        param.requires_grad = name.startswith(LAYER_PREFIX)
    return student.to(device)


def trained_layers(student, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {
        name: param.detach().to("cpu", dtype).contiguous()
        for name, param in student.named_parameters()
        if param.requires_grad
    }


# --------------------------------------------------------------------------- #
# data
# --------------------------------------------------------------------------- #
def prompt_templates(tokenizer) -> list[tuple[list[int], list[int]]]:
    """(head, tail) token ids wrapped around an excerpt: bare text, the
    evaluation's summarization format, and a chat turn (if the tokenizer has a
    chat template)."""
    templates = [
        ([], []),
        (encode(tokenizer, SUMMARY_HEAD), encode(tokenizer, SUMMARY_TAIL)),
    ]
    if getattr(tokenizer, "chat_template", None):
        marker = "\x00"
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": marker}], tokenize=False,
            add_generation_prompt=True,
        )
        head, tail = text.split(marker)
        templates.append(
            (encode(tokenizer, head), encode(tokenizer, CHAT_QUESTION + tail))
        )
    return templates


def doc_windows(docs: list[list[int]], seq_len: int, eos_id: int) -> list[list[int]]:
    """Non-overlapping ``seq_len`` windows of the documents joined by EOS."""
    stream = [t for doc in docs for t in (*doc, eos_id)]
    return [stream[i:i + seq_len] for i in range(0, len(stream) - seq_len + 1, seq_len)]


def excerpt_prompts(docs: list[list[int]], templates, num: int, rng: random.Random,
                    min_len: int, max_len: int) -> list[list[int]]:
    """Short excerpts of random documents, each wrapped in the next template."""
    long_docs = [d for d in docs if len(d) >= min_len]
    prompts = []
    for i in range(num):
        doc = rng.choice(long_docs)
        n = min(len(doc), rng.randint(min_len, max_len))
        start = rng.randrange(len(doc) - n + 1)
        head, tail = templates[i % len(templates)]
        prompts.append(head + doc[start:start + n] + tail)
    return prompts


@torch.no_grad()
def greedy_continuations(teacher, prompts: list[list[int]], seq_len: int,
                         batch_size: int, pad_id: int, eos_id: int, device,
                         progress=None) -> list[list[int]]:
    """Each prompt followed by the teacher's greedy continuation, cut at EOS
    (kept) and at ``seq_len`` tokens in all."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[list[int] | None] = [None] * len(prompts)
    for b in range(0, len(order), batch_size):
        idx = order[b:b + batch_size]
        width = max(len(prompts[i]) for i in idx)
        ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, i in enumerate(idx):  # left padding
            ids[row, width - len(prompts[i]):] = torch.tensor(prompts[i])
            mask[row, width - len(prompts[i]):] = 1
        gen = [[] for _ in idx]
        if width < seq_len:
            gen = teacher.generate(
                input_ids=ids.to(device), attention_mask=mask.to(device),
                max_new_tokens=seq_len - width, do_sample=False,
                pad_token_id=pad_id, eos_token_id=eos_id,
            )[:, width:].tolist()
        for row, i in enumerate(idx):
            new = gen[row]
            if eos_id in new:
                new = new[:new.index(eos_id) + 1]
            out[i] = prompts[i] + new
        if progress is not None:
            progress.update(len(idx))
    return out


def pad_batch(seqs: list[list[int]], seq_len: int, pad_id: int):
    ids = torch.full((len(seqs), seq_len), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), seq_len), dtype=torch.bool)
    for row, seq in enumerate(seqs):
        seq = seq[:seq_len]
        ids[row, :len(seq)] = torch.tensor(seq)
        mask[row, :len(seq)] = True
    return ids, mask


# --------------------------------------------------------------------------- #
# training
# --------------------------------------------------------------------------- #
def kd_loss(student_logits, teacher_logits, mask) -> torch.Tensor:
    """Mean KL(teacher || student) over the tokens of ``mask``."""
    s = student_logits[mask].float().log_softmax(-1)
    t = teacher_logits[mask].float().log_softmax(-1)
    return F.kl_div(s, t, log_target=True, reduction="batchmean")


def lr_at(step: int, steps: int, warmup: int) -> float:
    """Linear warm-up, then cosine decay to a tenth (a factor of the base lr)."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))


def autocast(device):
    # bf16 matmuls on GPU, fp32 master weights; CPU runs stay in fp32.
    if torch.device(device).type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


@torch.no_grad()
def evaluate(student, teacher, ids, mask, batch_size: int, device) -> dict:
    """KL and top-1 agreement (the draft's argmax is the teacher's) per token."""
    kl_sum = agree = total = 0.0
    for b in range(0, len(ids), batch_size):
        x, m = ids[b:b + batch_size].to(device), mask[b:b + batch_size].to(device)
        with autocast(device):
            t = teacher(x).logits
            s = student(x).logits
        n = int(m.sum())
        kl_sum += float(kd_loss(s, t, m)) * n
        agree += float((s.argmax(-1) == t.argmax(-1))[m].sum())
        total += n
    return {"kl": kl_sum / total, "top1_agreement": agree / total}


def train(student, teacher, ids, mask, *, steps: int, batch_size: int, lr: float,
          warmup: int, seed: int, device, time_limit_s: float = 0.0,
          progress=None) -> dict:
    """AdamW on the student's trainable layers; returns the loss curve."""
    params = [p for p in student.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(s, steps, warmup))
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(ids), generator=gen)
    pos, losses, start = 0, [], time.monotonic()
    student.train()
    for _ in range(steps):
        if pos + batch_size > len(order):
            order, pos = torch.randperm(len(ids), generator=gen), 0
        idx = order[pos:pos + batch_size]
        pos += batch_size
        x, m = ids[idx].to(device), mask[idx].to(device)
        with torch.no_grad(), autocast(device):
            t = teacher(x).logits
        with autocast(device):
            s = student(x).logits
        loss = kd_loss(s, t, m)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if progress is not None:
            progress.update(1)
            progress.set_postfix(kl=f"{losses[-1]:.3f}")
        if time_limit_s and time.monotonic() - start > time_limit_s:
            break
    student.eval()
    return {"steps_done": len(losses), "loss_first": losses[0],
            "loss_last": losses[-1], "losses_every_10": losses[::10],
            "train_s": time.monotonic() - start}
