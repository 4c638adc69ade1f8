"""One SpecExtend request through ``vllm serve`` on CPU, end to end.

Starts ``vllm serve MODEL --speculative-model DRAFT --spec-extend JSON`` on a
free local port, waits for ``/health``, sends one long chat request (a PG-19
excerpt from ``../shared/data`` if present, else a built-in text) asking for a
summary, prints the answer, its latency and the spec-decode / SpecExtend lines
of ``/metrics``, then stops the server. The server log goes to a temporary
directory and is tailed on failure. ``scripts/demo.sh`` sets up the venv and
the model, then runs this with the venv's Python (it needs ``openai`` and
``tokenizers``).

Exit status: 0 when the answer is non-empty, the draft proposed tokens and
SpecExtend retrieved chunks at least once; 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data" / "pg19" / "pg19_2K.jsonl"
DEFAULT_SPEC_EXTEND = '{"min_context": 256, "top_k": 8, "recent_tokens": 128}'
METRIC_PREFIXES = (
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_extend_",
)
LOG_MARKERS = ("SpecExtend enabled", "SpecExtend metrics:", "SpecDecoding metrics:")
HEADER_END = "### Text:"

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


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def load_document(path: Path) -> tuple[str, str]:
    """(text, source) of the longest document of a PG-19 jsonl, header stripped."""
    if path.is_file():
        best = ""
        with path.open() as f:
            for line in f:
                text = json.loads(line)["text"]
                i = text.find(HEADER_END)
                if 0 <= i < 200:
                    text = text[i + len(HEADER_END):]
                text = text.replace("<s>", "").strip()
                if len(text) > len(best):
                    best = text
        if best:
            return best, str(path)
    return "\n".join([FALLBACK_TEXT] * 20), "built-in text (repeated)"


def excerpt(text: str, model: str, num_tokens: int) -> tuple[str, int]:
    """The first ``num_tokens`` tokens of ``text`` under the model's tokenizer."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(model) / "tokenizer.json"))
    ids = tok.encode(text, add_special_tokens=False).ids[:num_tokens]
    return tok.decode(ids), len(ids)


def tail(path: Path, lines: int = 60) -> str:
    try:
        return "".join(path.read_text(errors="replace").splitlines(True)[-lines:])
    except OSError as e:
        return f"(cannot read {path}: {e})"


def wait_healthy(proc: subprocess.Popen, url: str, timeout_s: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return time.monotonic() - start
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(1.0)
    raise RuntimeError(f"{url} not healthy after {timeout_s:.0f} s")


def stop_server(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGINT to the server, then SIGTERM and SIGKILL to its process group."""
    pgid = proc.pid  # start_new_session=True: the server leads its own group
    if proc.poll() is None:
        log(f"stopping vllm serve (pid {proc.pid}): SIGINT")
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            log("still running: SIGTERM to its process group")
            _killpg(pgid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log("still running: SIGKILL to its process group")
                _killpg(pgid, signal.SIGKILL)
                proc.wait()
    # Children the server left behind (engine core, workers).
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not _killpg(pgid, 0):
            break
        _killpg(pgid, sig)
        time.sleep(2)


def _killpg(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def scrape(base: str) -> list[str]:
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
        text = r.read().decode()
    return [ln for ln in text.splitlines() if ln.startswith(METRIC_PREFIXES)]


def metric_value(lines: list[str], name: str) -> float:
    """Sum of a metric over its label sets (0 if absent)."""
    total = 0.0
    for ln in lines:
        head, _, value = ln.rpartition(" ")
        if head.split("{", 1)[0] == name:
            total += float(value)
    return total


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="target model directory")
    p.add_argument("--draft", default=None, help="draft model (default: --model)")
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--spec-extend", default=DEFAULT_SPEC_EXTEND, metavar="JSON")
    p.add_argument("--venv-bin", default=str(Path(sys.executable).parent),
                   help="directory holding the vllm executable")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: pick a free port")
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--kv-cache-memory-bytes", default="1G")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA,
                   help="PG-19 jsonl to take the document from")
    p.add_argument("--prompt-tokens", type=int, default=1500)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--startup-timeout", type=float, default=360.0)
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--log-dir", type=Path, default=None,
                   help="where the server log goes (default: a new temp dir)")
    p.add_argument("--serve-arg", action="append", default=[],
                   help="extra argument for vllm serve (repeatable)")
    return p.parse_args(argv)


def serve_command(args: argparse.Namespace, port: int) -> list[str]:
    return [
        str(Path(args.venv_bin) / "vllm"), "serve", args.model,
        "--speculative-model", args.draft or args.model,
        "--num-speculative-tokens", str(args.num_speculative_tokens),
        "--spec-extend", args.spec_extend,
        "--block-size", str(args.block_size),
        "--kv-cache-memory-bytes", args.kv_cache_memory_bytes,
        "--max-model-len", str(args.max_model_len),
        "--dtype", args.dtype,
        "--enforce-eager",
        "--host", args.host,
        "--port", str(port),
        *args.serve_arg,
    ]


def ask(base: str, args: argparse.Namespace, question: str) -> str:
    """Send the chat request, print the answer and its timing; return the answer."""
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
    return answer


def report_spec_decode(base: str, server_log: Path) -> list[str]:
    """Print /metrics and log lines of spec decoding; return what is missing."""
    # The worker publishes SpecExtend counters every VLLM_LOG_STATS_INTERVAL.
    time.sleep(2.5)
    lines = scrape(base)
    say("", "=== /metrics ===", *(lines or ["(no spec-decode metrics)"]))
    drafted = metric_value(lines, "vllm:spec_decode_num_draft_tokens_total")
    accepted = metric_value(lines, "vllm:spec_decode_num_accepted_tokens_total")
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
    if not metric_value(lines, "vllm:spec_extend_retrievals_total"):
        problems.append("SpecExtend made no retrieval "
                        "(vllm:spec_extend_retrievals_total is 0 or missing)")
    return problems


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    port = args.port or free_port(args.host)
    base = f"http://{args.host}:{port}"
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="specextend-demo-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    server_log = log_dir / "vllm_serve.log"

    text, source = load_document(args.data)
    doc, num_doc_tokens = excerpt(text, args.model, args.prompt_tokens)
    question = (
        "Here is an excerpt from a book:\n\n" + doc
        + "\n\nSummarize the excerpt above in one paragraph."
    )

    cmd = serve_command(args, port)
    env = dict(os.environ, VLLM_LOG_STATS_INTERVAL="2")
    env.setdefault("PYTHONPYCACHEPREFIX", "/tmp/pycache")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    log(f"command: {shlex.join(cmd)}")
    log(f"server log: {server_log}")
    start = time.monotonic()
    with server_log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    try:
        try:
            startup = wait_healthy(proc, f"{base}/health", args.startup_timeout)
        except RuntimeError as e:
            log(f"FAILED: {e}; last lines of {server_log}:")
            say(tail(server_log))
            return 1
        log(f"server healthy after {startup:.0f} s")
        log(f"request: {num_doc_tokens}-token excerpt of {source}, "
            f"max_tokens={args.max_tokens}, temperature=0")
        answer = ask(base, args, question)
        problems = report_spec_decode(base, server_log)
        if not answer.strip():
            problems.insert(0, "empty answer")
        say("")
        if problems:
            log("FAILED: " + "; ".join(problems))
            return 1
        log(f"OK: end to end {time.monotonic() - start:.0f} s")
        return 0
    finally:
        stop_server(proc, grace_s=30)
        log(f"server log: {server_log}")


if __name__ == "__main__":
    raise SystemExit(main())
