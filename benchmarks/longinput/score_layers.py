"""Which of a target's attention layers would retrieve a passkey's chunk?

CMR ranks 32-token chunks by the attention mass one layer's query of the last
accepted token gives them, averaged over the query heads
(``spec_extend.score_layer``; the paper uses the final layer). This probe asks,
for each layer, how often that ranking puts the chunk holding the key's digits
among the top k candidates, for every query from the prompt's last token to the
one before the key's last digit: the queries a retrieval may use while the
answer is written. Cases are the passkey prompts of ``eval_longinput``'s
``needle`` task that the model answers correctly (greedy, Hugging Face
transformers, no vLLM), so a layer can be chosen on a CPU before a GPU run
measures what the draft reproduces.

    python -m benchmarks.longinput.score_layers --model M --length 4096 --out R.json

Writes R.json (per case and query, the needle chunk's rank in every layer) and
R.md (per layer, the share of queries with the chunk in the top 1 / k).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from benchmarks.harness.meta import run_metadata
from benchmarks.longinput import inputs, needle
from vllm_specextend.config import SpecExtendConfig
from vllm_specextend.retrieval import selection


def chunk_mass(query: torch.Tensor, keys: torch.Tensor, chunk: int,
               scale: float) -> torch.Tensor:
    """Attention mass per ``chunk``-token chunk, averaged over heads, by the
    retriever's own reduction (``selection.chunk_mass``) over per-chunk
    log-sum-exps: [num_chunks] fp32. ``query`` [H, D], ``keys`` [H, T, D]
    (KV heads already repeated), both post-RoPE; ``scale``: the layer's."""
    heads, length = keys.shape[0], keys.shape[1]
    scores = torch.einsum("hd,htd->ht", query.float(), keys.float()) * scale
    num_chunks = -(-length // chunk)
    padded = torch.nn.functional.pad(scores, (0, num_chunks * chunk - length),
                                     value=float("-inf"))
    lse = padded.view(heads, num_chunks, chunk).logsumexp(-1)  # [H, num_chunks]
    return selection.chunk_mass(lse[None], 1)[0]


def needle_rank(mass: torch.Tensor, needle_chunks: list[int], first: int, end: int) -> int:
    """Rank (0 = top) of the best of ``needle_chunks`` among the candidate
    chunks ``first <= c < end`` (past the sinks, before the recent window)."""
    best = max(float(mass[c]) for c in needle_chunks)
    return int((mass[first:end] > best).sum())


class Capture:
    """Per layer: post-RoPE queries of the last ``rows`` positions, all keys,
    the softmax scale and the sliding window, through a transformers
    attention function that wraps SDPA."""

    def __init__(self):
        self.rows = 0
        self.layers: dict[int, tuple[torch.Tensor, torch.Tensor, float, int | None]] = {}

    def install(self, model) -> None:
        from transformers import AttentionInterface
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        def attention(module, q, k, v, mask, **kwargs):
            if self.rows:
                self.layers[module.layer_idx] = (
                    q[0, :, -self.rows:].clone(), k[0].clone(),
                    kwargs.get("scaling") or q.shape[-1] ** -0.5,
                    kwargs.get("sliding_window"),
                )
            return sdpa_attention_forward(module, q, k, v, mask, **kwargs)

        AttentionInterface.register("specextend_capture", attention)
        model.set_attn_implementation("specextend_capture")


def probe_case(model, tokenizer, capture: Capture, prompt: list[int], key: str,
               cfg: SpecExtendConfig) -> dict:
    """The passkey case's answer and, if right, per answer query and layer the
    needle chunk's rank among the chunks ``cfg`` (a CMR working set) could
    retrieve: past the sinks, before the recent window (``selection``'s
    rules). Sliding-window layers, which the plugin refuses to score with,
    rank None."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=14, do_sample=False)
    answer = out[0, len(prompt):].tolist()
    span = needle.key_tokens(tokenizer.decode, answer, key)
    row = {"key": key, "answer": tokenizer.decode(answer), "correct": span is not None}
    if span is None:
        return row
    tokens = prompt + answer[: span.stop]
    first_query = len(prompt) - 1  # the prompt's last token
    capture.rows = len(tokens) - first_query
    with torch.no_grad():
        model(torch.tensor([tokens]))
    capture.rows = 0
    chunk = cfg.chunk_size
    needle_ids = inputs.encode(tokenizer, needle.NEEDLE.format(key=key))
    at = next(i for i in range(len(prompt)) if prompt[i:i + len(needle_ids)] == needle_ids)
    digits = [at + i for i, t in enumerate(needle_ids)
              if tokenizer.decode([t]).strip().isdigit()]
    needle_chunks = sorted({p // chunk for p in digits})
    group = model.config.num_attention_heads // model.config.num_key_value_heads
    first = cfg.sink_tokens // chunk
    ranks = []  # [query][layer]
    for i, position in enumerate(range(first_query, len(tokens) - 1)):
        context = position + 1
        end = selection.window_start(cfg, context) // chunk
        ranks.append([
            None if window else needle_rank(
                chunk_mass(q[:, i], k[:, :context].repeat_interleave(group, 0), chunk,
                           scale), needle_chunks, first, end)
            for q, k, scale, window in (capture.layers[n] for n in sorted(capture.layers))
        ])
    return {**row, "needle_chunks": needle_chunks, "first_digit_query": span.start,
            "ranks": ranks}


def summarize(rows: list[dict], top: list[int]) -> list[dict]:
    """Per layer: the share of queries (all answer queries, and the one just
    before the first digit) with the needle chunk in each top k."""
    cases = [r for r in rows if r["correct"]]
    if not cases:
        return []
    layers = len(cases[0]["ranks"][0])
    table = []
    for layer in range(layers):
        every = [q[layer] for r in cases for q in r["ranks"]]
        before = [r["ranks"][r["first_digit_query"]][layer] for r in cases]
        if None in every:  # a sliding-window layer: not a scoring layer
            continue
        table.append({
            "layer": layer,
            **{f"all_top{k}": sum(x < k for x in every) / len(every) for k in top},
            **{f"pre_digit_top{k}": sum(x < k for x in before) / len(before) for k in top},
        })
    return table


def markdown(meta: dict, rows: list[dict], table: list[dict], top: list[int]) -> str:
    correct = sum(r["correct"] for r in rows)
    lines = [f"# Needle chunk rank per scoring layer ({meta['config']['model']})", "",
             f"{correct} of {len(rows)} passkey cases answered correctly; ranks over "
             f"{sum(len(r['ranks']) for r in rows if r['correct'])} answer queries.", "",
             "| layer | " + " | ".join(f"all: top {k}" for k in top) + " | "
             + " | ".join(f"before 1st digit: top {k}" for k in top) + " |",
             "|---|" + "---|" * (2 * len(top))]
    for t in table:
        lines.append(f"| {t['layer']} | "
                     + " | ".join(f"{t[f'all_top{k}']:.2f}" for k in top) + " | "
                     + " | ".join(f"{t[f'pre_digit_top{k}']:.2f}" for k in top) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--length", type=int, default=4096,
                        help="prompt tokens (eval_longinput's 8K passkey prompts "
                        "leave room for 24 new tokens and K + 1: 8163 at K = 4)")
    parser.add_argument("--depths", type=float, nargs="+", default=[0.1, 0.3, 0.5, 0.7])
    parser.add_argument("--prompts", type=int, default=8, help="haystacks per depth")
    parser.add_argument("--chunk-size", type=int, default=32)
    parser.add_argument("--sink-tokens", type=int, default=32)
    parser.add_argument("--window-tokens", type=int, default=128)
    parser.add_argument("--top", type=int, nargs="+", default=[1, 3, 11, 27],
                        help="top k to report (11 and 27: the chunks of 512- and "
                        "1024-token working sets at a quarter window)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    capture = Capture()
    capture.install(model)
    cfg = SpecExtendConfig(chunk_size=args.chunk_size, sink_tokens=args.sink_tokens,
                           recent_tokens=args.window_tokens)
    haystacks = [inputs.haystack(tokenizer, args.length, i) for i in range(args.prompts)]
    rows = []
    for depth in args.depths:
        for i, haystack in enumerate(haystacks):
            key = needle.pass_key(args.seed, i)
            prompt = needle.needle_prompt(
                lambda text: inputs.encode(tokenizer, text), haystack, key, depth,
                args.length,
            )
            row = probe_case(model, tokenizer, capture, prompt, key, cfg)
            rows.append({"depth": depth, "haystack": i, **row})
            print(f"depth {depth} haystack {i}: "
                  f"{'correct' if row['correct'] else 'missed'}", flush=True)
    table = summarize(rows, args.top)
    meta = run_metadata(args)
    out = Path(args.out)
    out.write_text(json.dumps({"meta": meta, "layers": table, "rows": rows}, indent=1))
    out.with_suffix(".md").write_text(markdown(meta, rows, table, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
