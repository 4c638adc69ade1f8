"""One SpecExtend request through ``vllm serve`` on CPU, end to end.

Starts ``vllm serve MODEL --speculative-model DRAFT --spec-extend JSON`` on a
free local port, waits for ``/health``, sends one long chat request (the first
PG-19 book of ``../shared/data`` if present, else a built-in text) asking for a
summary, prints the answer, its latency and the spec-decode / SpecExtend lines
of ``/metrics``, then stops the server (``benchmarks.harness.server``: SIGTERM
to the API server, which stops its engine). The server log goes to a temporary
directory and is tailed on failure. ``scripts/demo.sh`` sets up the venv and
the model, then runs this with the venv's Python (it needs ``openai`` and
``tokenizers``) and the repository on ``PYTHONPATH``.

Exit status: 0 when the answer is non-empty, the draft proposed tokens,
SpecExtend retrieved chunks at least once and the server stopped cleanly (no
error line in its log); 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import prompts
from benchmarks.harness.server import log_errors, scrape, serve

DEFAULT_SPEC_EXTEND = '{"min_context": 256, "top_k": 8, "recent_tokens": 128}'
METRIC_PREFIXES = (
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_extend_",
)
LOG_MARKERS = ("SpecExtend enabled", "SpecExtend metrics:", "SpecDecoding metrics:")

FALLBACK_TEXT = """\
The lighthouse keeper had kept the lamp on the northern cape for thirty-one
years, and in all that time he had never once let it go dark. Each evening he
climbed the iron stair, trimmed the wick, polished the great lens until it
threw the sunset back at the sea, and wrote in his log the state of the wind,
the ships that passed and the birds that had struck the glass. The village
below thought him proud and a little mad; the fishermen thought him a saint.
When the company that owned the light sent word that an electric lamp would
replace him in the spring, he read the letter twice, folded it into the log,
and went on trimming the wick as before. That winter a storm drove a coal
steamer onto the rocks below the cape, and it was the keeper, rowing out alone
in the ship's own lifeboat, who brought the crew ashore one by one.
"""


def say(*lines: str) -> None:
    """Write lines to stdout, flushed (the server runs for minutes)."""
    sys.stdout.write("".join(f"{ln}\n" for ln in lines))
    sys.stdout.flush()


def log(msg: str) -> None:
    say(f"[demo] {msg}")


def load_document() -> tuple[str, str]:
    """(text, source): the first PG-19 book of the shared data, else the
    built-in text."""
    try:
        return prompts.load_texts("pg19")[0], f"PG-19 under {prompts.data_dir()}"
    except (FileNotFoundError, IndexError):
        return "\n".join([FALLBACK_TEXT] * 20), "built-in text (repeated)"


def excerpt(text: str, model: str, num_tokens: int) -> tuple[str, int]:
    """The first ``num_tokens`` tokens of ``text`` under the model's tokenizer."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(model) / "tokenizer.json"))
    ids = tok.encode(text, add_special_tokens=False).ids[:num_tokens]
    return tok.decode(ids), len(ids)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="target model directory")
    p.add_argument("--draft", default=None, help="draft model (default: --model)")
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--spec-extend", default=DEFAULT_SPEC_EXTEND, metavar="JSON")
    p.add_argument("--venv-bin", default=str(Path(sys.executable).parent),
                   help="directory holding the vllm executable")
    p.add_argument("--port", type=int, default=0, help="0: pick a free port")
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--kv-cache-memory-bytes", default="1G")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--prompt-tokens", type=int, default=1500)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--startup-timeout", type=float, default=360.0)
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--log-dir", type=Path, default=None,
                   help="where the server log goes (default: a new temp dir)")
    p.add_argument("--serve-arg", action="append", default=[],
                   help="extra argument for vllm serve (repeatable)")
    return p.parse_args(argv)


def serve_args(args: argparse.Namespace) -> list[str]:
    return [
        args.model,
        "--speculative-model", args.draft or args.model,
        "--num-speculative-tokens", str(args.num_speculative_tokens),
        "--spec-extend", args.spec_extend,
        "--block-size", str(args.block_size),
        "--kv-cache-memory-bytes", args.kv_cache_memory_bytes,
        "--max-model-len", str(args.max_model_len),
        "--dtype", args.dtype,
        "--enforce-eager",
        *args.serve_arg,
    ]


def ask(base: str, args: argparse.Namespace, question: str) -> tuple[str, float]:
    """Send the chat request, print the answer and its timing; return the
    answer and the latency."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{base}/v1", api_key="EMPTY",
                    timeout=args.request_timeout, max_retries=0)
    start = time.perf_counter()
    resp = client.chat.completions.create(
        model=args.model,
        messages=[{"role": "user", "content": question}],
        max_tokens=args.max_tokens,
        temperature=0,
    )
    latency = time.perf_counter() - start
    answer = resp.choices[0].message.content or ""
    say("", "=== answer ===", answer.strip(), "", "=== request ===",
        f"latency:           {latency:.2f} s")
    if resp.usage is not None:
        n = resp.usage.completion_tokens
        say(f"prompt tokens:     {resp.usage.prompt_tokens}",
            f"completion tokens: {n} ({n / latency:.2f} tokens/s)")
    say(f"finish reason:     {resp.choices[0].finish_reason}")
    return answer, latency


def report_spec_decode(base: str, server_log: Path) -> list[str]:
    """Print /metrics and log lines of spec decoding; return what is missing."""
    # The worker publishes SpecExtend counters every VLLM_LOG_STATS_INTERVAL.
    time.sleep(2.5)
    metrics = {k: v for k, v in scrape(base).items() if k.startswith(METRIC_PREFIXES)}
    say("", "=== /metrics ===",
        *([f"{k} {v:g}" for k, v in metrics.items()] or ["(no spec-decode metrics)"]))
    drafted = metrics.get("vllm:spec_decode_num_draft_tokens_total", 0)
    accepted = metrics.get("vllm:spec_decode_num_accepted_tokens_total", 0)
    if drafted:
        say(f"draft acceptance:  {accepted:.0f}/{drafted:.0f} = "
            f"{accepted / drafted:.1%}")

    say("", "=== server log (last SpecExtend / SpecDecoding lines) ===")
    log_lines = server_log.read_text(errors="replace").splitlines()
    for marker in LOG_MARKERS:
        say(*[ln for ln in log_lines if marker in ln][-3:])

    problems = []
    if not drafted:
        problems.append("the draft proposed no tokens")
    if not metrics.get("vllm:spec_extend_retrievals_total"):
        problems.append("SpecExtend made no retrieval "
                        "(vllm:spec_extend_retrievals_total is 0 or missing)")
    return problems


def main(argv=None) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the server is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="specextend-demo-"))
    server_log = log_dir / "vllm_serve.log"

    text, source = load_document()
    doc, num_doc_tokens = excerpt(text, args.model, args.prompt_tokens)
    question = (
        "Here is an excerpt from a book:\n\n" + doc
        + "\n\nSummarize the excerpt above in one paragraph."
    )

    env = dict(os.environ, VLLM_LOG_STATS_INTERVAL="2")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    log(f"server log: {server_log}")
    start = time.monotonic()
    try:
        with serve(serve_args(args), server_log, args.startup_timeout, env=env,
                   bin_dir=args.venv_bin, port=args.port) as server:
            log(f"command: {' '.join(server.command)}")
            log(f"server healthy after {server.startup_s:.0f} s")
            log(f"request: {num_doc_tokens}-token excerpt of {source}, "
                f"max_tokens={args.max_tokens}, temperature=0")
            answer, latency = ask(server.base, args, question)
            problems = report_spec_decode(server.base, server_log)
            if not answer.strip():
                problems.insert(0, "empty answer")
            say("")
            log("stopping vllm serve")
            stop_start = time.monotonic()
    except RuntimeError as e:
        log(f"FAILED: {e}")
        return 1
    stop_s = time.monotonic() - stop_start
    if server.forced_stop:
        problems.append("the server did not stop by itself: "
                        + "; ".join(server.forced_stop))
    errors = log_errors(server_log)
    if errors:
        problems.append(f"{len(errors)} error lines in the server log, "
                        f"first: {errors[0]}")
    log(f"server start {server.startup_s:.0f} s, request {latency:.1f} s, "
        f"stop {stop_s:.0f} s, end to end {time.monotonic() - start:.0f} s")
    if problems:
        log("FAILED: " + "; ".join(problems))
        return 1
    log("OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
