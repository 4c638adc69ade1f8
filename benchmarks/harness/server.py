"""Start ``vllm serve`` on a free local port, wait for ``/health``, and stop it
the way vLLM expects; read its ``/metrics``.

Stopping: vLLM's API server shuts its engine down itself on SIGTERM or SIGINT
(abort or drain the requests, then the engine core processes, then the HTTP
server). Two things break that: a signal to the whole process group reaches
the engine core at the same time, so it exits while the API server still reads
its outputs (``AsyncLLM output_handler failed ... EngineDeadError``); and with
vLLM's default ``--shutdown-timeout 0`` the API server kills the engine core
right after asking it to stop, before it frees its shared memory and
semaphores (the resource tracker's "leaked" warnings). So ``serve`` passes
``--shutdown-timeout`` (``SHUTDOWN_TIMEOUT_S``, unless the arguments set one;
with no request in flight it costs nothing) and ``stop`` signals the API
server alone, waits for its process group to empty, and kills only what
outlives that.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

HOST = "127.0.0.1"
SHUTDOWN_TIMEOUT_S = 30


def vllm_command(bin_dir: str | Path | None = None) -> list[str]:
    """The ``vllm`` CLI of this Python (or of ``bin_dir``)."""
    script = Path(bin_dir or Path(sys.executable).parent) / "vllm"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "vllm.entrypoints.cli.main"]


def serve_args_parser(doc: str, argv: list[str] | None = None
                      ) -> tuple[argparse.ArgumentParser, list[str], list[str]]:
    """For a script whose arguments after ``--`` go to every ``vllm serve``: its
    parser (described by ``doc``'s first paragraph), its own arguments and those
    for the servers (``argv``: default ``sys.argv[1:]``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(
        description=" ".join(doc.split("\n\n")[0].split()),
        usage="%(prog)s [options] [-- VLLM_SERVE_ARGS...]")
    return parser, argv[:cut], argv[cut + 1:]


def loads_dummy_weights(serve_args: list[str]) -> bool:
    """Whether these ``vllm serve`` arguments load dummy weights."""
    pairs = zip(serve_args, [*serve_args[1:], None])
    return any(a == "--load-format=dummy" or (a, b) == ("--load-format", "dummy")
               for a, b in pairs)


def tokenizer_gap(target: str | Path, tokenizer: str | Path,
                  serve_args: list[str]) -> str | None:
    """Why ``tokenizer`` cannot stand in for ``target`` served with these
    arguments: they load dummy weights, and it knows fewer ids than the
    model's vocabulary (``config.json``'s ``vocab_size``), so the model emits
    ids it lacks, and vLLM's detokenizer spends about 10 ms of the API
    server's thread on each (seen 2026-11-27: the server fell seconds behind
    the engine, and the client timed the server). None with real weights
    (they never emit a checkpoint's padding ids), where it knows them all, or
    where either is not a local folder to read."""
    if not loads_dummy_weights(serve_args):
        return None
    config = Path(target) / "config.json"
    tok_file = Path(tokenizer) / "tokenizer.json"
    if not (config.is_file() and tok_file.is_file()):
        return None
    from tokenizers import Tokenizer

    vocab = json.loads(config.read_text()).get("vocab_size")
    known = Tokenizer.from_file(str(tok_file)).get_vocab_size(with_added_tokens=True)
    if vocab is None or known >= vocab:
        return None
    return (f"the tokenizer {tokenizer} knows {known} ids, the model {target} "
            f"emits up to {vocab}: fill it with `python -m benchmarks.models."
            f"builders pad-tokenizer {tokenizer} OUT --vocab-size {vocab}`")


def free_port(host: str = HOST) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def tail(path: Path, n: int = 40) -> str:
    """A failure report: the log's exception messages, then its last lines."""
    try:
        lines = Path(path).read_text(errors="replace").splitlines(True)
    except OSError as e:
        return f"(cannot read {path}: {e})\n"
    # The root cause is often far above the tail, in a worker's traceback.
    # argparse's refusal ("main.py: error: unrecognized arguments: ...") too.
    causes = dict.fromkeys(
        m.group(0) for ln in lines
        if " WARNING " not in ln
        and (m := re.search(r"\w+(Error|Exception): .*|^\S+: error: .*", ln)))
    return "".join([*(f"{c}\n" for c in list(causes)[:5]), f"last lines of {path}:\n",
                    *lines[-n:]])


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def stop(proc: subprocess.Popen, grace_s: float = 60.0) -> list[str]:
    """SIGTERM to the API server alone; it stops its engine processes. Only
    what is left after ``grace_s`` (the group leader or its children) gets
    SIGKILL. Returns what had to be forced, for the caller to report."""
    forced = []
    pgid = proc.pid  # start_new_session=True: the server leads its own group
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            forced.append(f"vllm serve (pid {proc.pid}) ignored SIGTERM for "
                          f"{grace_s:.0f} s")
    deadline = time.monotonic() + (10.0 if not forced else 0.0)
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _group_alive(pgid):
        forced.append(f"processes of group {pgid} left: SIGKILL")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    proc.wait()
    return forced


@dataclass
class Server:
    base: str
    """http://host:port"""
    command: list[str]
    startup_s: float
    log: Path
    forced_stop: list[str] | None = None
    """Filled when the server stops: what had to be killed (empty: clean)."""


def wait_healthy(proc: subprocess.Popen, base: str, log: Path,
                 timeout_s: float) -> float:
    """Seconds until ``/health`` answered; RuntimeError (with the log's tail)
    if the server exits first or takes longer than ``timeout_s``."""
    start = time.monotonic()
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited ({proc.returncode}):\n{tail(log)}")
        if time.monotonic() - start > timeout_s:
            raise RuntimeError(
                f"vllm serve not healthy in {timeout_s:.0f} s:\n{tail(log)}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"{base}/health", timeout=5) as r:
                if r.status == 200:
                    return time.monotonic() - start
        time.sleep(1)


@contextlib.contextmanager
def serve(args: list[str], log: Path, timeout_s: float, env: dict | None = None,
          bin_dir: str | Path | None = None, host: str = HOST, port: int = 0,
          stop_grace_s: float = 60.0):
    """Run ``vllm serve ARGS`` until ``/health`` answers and yield a
    ``Server``; the server is stopped on exit, errors included. ``env``: the
    server's environment (default: this process's), with
    ``VLLM_LOG_STATS_INTERVAL=1`` unless it sets one; ``port`` 0: a free one.
    ``stop_grace_s`` must exceed the server's shutdown timeout."""
    port = port or free_port(host)
    if "--shutdown-timeout" not in args:
        args = [*args, "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)]
    cmd = [*vllm_command(bin_dir), "serve", *args, "--host", host, "--port", str(port)]
    env = {"VLLM_LOG_STATS_INTERVAL": "1", **(os.environ if env is None else env)}
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with log.open("wb") as out:
        # Its own session: a Ctrl-C of ours does not reach it before stop().
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    base = f"http://{host}:{port}"
    server = None
    try:
        try:
            wait_healthy(proc, base, log, timeout_s)
        except RuntimeError as e:
            raise RuntimeError(f"{e}command: {shlex.join(cmd)}") from None
        server = Server(base, cmd, time.monotonic() - start, log)
        yield server
    finally:
        forced = stop(proc, stop_grace_s)
        if server is not None:
            server.forced_stop = forced


def scrape(base: str) -> dict[str, float]:
    """``/metrics`` as {name: value summed over label sets}."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=30) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            head, _, value = line.rpartition(" ")
            name = head.split("{", 1)[0]
            out[name] = out.get(name, 0.0) + float(value)
    return out


def log_errors(log: Path) -> list[str]:
    """ERROR lines and leak warnings of a server log (a clean stop has none)."""
    text = Path(log).read_text(errors="replace")
    return [ln for ln in text.splitlines()
            if " ERROR " in ln or "leaked" in ln or "EngineDeadError" in ln]
