"""Soak: ``vllm serve --spec-extend`` under a long, mixed and hostile load, and
the checks that nothing took it down (issue #21).

For ``--duration-s``, ``--concurrency`` clients (``benchmarks.harness.traffic``)
send completions, streams and chats with log-uniform input lengths, close a
share of them at a random point (in the queue, in prefill, while decoding) and
send a share of malformed requests, against a server whose KV cache is small
enough that vLLM preempts. Eight fixed probe requests go before and after.
The pass criteria, each recorded with its figures:

* ``no_engine_death``: ``/health`` answered 200 at every poll (every
  ``--health-interval-s``), the server answered the probes afterwards, and its
  log names no dead engine;
* ``no_5xx``: no request got a 5xx answer;
* ``malformed_answered``: every malformed request got the status vLLM gives
  it, a 4xx with a message (the first line of each is recorded), or 200 for
  an unknown field, which OpenAI's API and vLLM accept;
* ``requests_complete``: every well-formed request that its client did not
  close got 200 and all its tokens, and none failed on the client's side;
* ``idle_at_end``: ``vllm:num_requests_running``/``waiting`` and the plugin's
  ``vllm:spec_extend_tracked_requests``/``request_slots`` back to 0;
* ``preempted``: ``vllm:num_preemptions_total`` moved;
* ``probes_stable``: the probes' tokens after the soak equal those before;
* ``probes_match_plain``: and equal a plain server's (the same flags without
  speculation, started here first, or ``--reference`` recorded earlier).

Probes are greedy and have a cache salt per round, so the round after the soak
recomputes its prompts as the first did instead of reading blocks it left in
the prefix cache. Under synthetic acceptance (``--acceptance-length`` > 0) the
sampler accepts a draft token by a coin flip, so the output is not plain
decoding's: ``probes_match_plain`` is then recorded as not applicable, no plain
server starts, and each probe is top-k 1 at temperature 1 with a seed of its
own (the same argmax tokens, while its coin flips come from its own generator,
where a temperature-0 request's come from the engine's, which the soak
advances).

    python -m benchmarks.serve.soak --target T --draft D --tokenizer TOK \\
        --duration-s 600 --concurrency 32 --min-input-len 1024 \\
        --max-input-len 32768 --out-dir benchmarks/results/soak \\
        -- --max-model-len 33792 --kv-cache-memory-bytes 12G ...

Arguments after ``--`` go to every ``vllm serve``. Writes
``<out-dir>/<stamp>_<device>.json`` (updated after each phase, so a run cut
short leaves what it saw) and the servers' logs in ``<stamp>_<device>_logs/``
beside it. Exit status 0 when every criterion passes.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import re
import shlex
import signal
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

from benchmarks import prompts
from benchmarks.harness import modes, traffic
from benchmarks.harness.meta import run_metadata
from benchmarks.harness.server import (
    log_errors,
    scrape,
    serve,
    serve_args_parser,
    tokenizer_gap,
)
from benchmarks.serve.bench_serve import async_scheduling, counter_deltas, serve_args

PROBES = 8
COUNTERS = ("vllm:num_preemptions_total", "vllm:request_success_total",
            "vllm:prompt_tokens_total", "vllm:generation_tokens_total")
DEAD_ENGINE = re.compile(r"EngineDeadError|Engine core proc \S+ died|EngineCore "
                         r"encountered a fatal error")


# --------------------------------------------------------------------------- #
# probes
# --------------------------------------------------------------------------- #
def probe_prompts(tokenizer, lengths: list[int]) -> list[list[int]]:
    """The fixed probe prompts: GovReport documents of the given lengths (the
    soak's traffic cuts PG-19's)."""
    return prompts.long_prompts(tokenizer, lengths, dataset="govreport")


def digest(ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]


def probe_body(model: str, ids: list[int], index: int, max_tokens: int,
               seeded: bool, salt: str) -> dict:
    body = {"model": model, "prompt": ids, "max_tokens": max_tokens,
            "ignore_eos": True, "return_token_ids": True, "cache_salt": salt,
            "temperature": 0.0}
    if seeded:
        body.update(temperature=1.0, top_k=1, seed=1000 + index)
    return body


def post(base: str, path: str, body: dict, timeout_s: float) -> dict:
    req = urllib.request.Request(f"{base}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return json.loads(r.read())


def run_probes(base: str, model: str, probes: list[list[int]], args,
               salt: str) -> list[list[int]]:
    """Each probe alone (batch 1, as every round runs them): its tokens."""
    out = []
    for i, ids in enumerate(probes):
        body = probe_body(model, ids, i, args.probe_output_len, args.seeded_probes,
                          salt)
        out.append(post(base, "/v1/completions", body,
                        args.request_timeout_s)["choices"][0]["token_ids"])
    return out


def read_reference(path: Path, probes: list[list[int]], max_tokens: int) -> dict:
    """A reference recorded for these very probes (``write_reference``)."""
    ref = json.loads(path.read_text())
    want = [{"prompt_sha256": digest(p), "max_tokens": max_tokens} for p in probes]
    got = [{k: p[k] for k in ("prompt_sha256", "max_tokens")} for p in ref["probes"]]
    if got != want:
        raise SystemExit(f"{path} was recorded for other probes (prompts or "
                         "--probe-output-len differ): record it again with these "
                         "--probe-lens, or leave --reference out to start a plain "
                         "server")
    return ref


def write_reference(path: Path, probes: list[list[int]], max_tokens: int,
                    tokens: list[list[int]], source: str) -> None:
    """What ``--reference`` reads: plain decoding's tokens for the probes."""
    path.write_text(json.dumps({"source": source, "probes": [
        {"prompt_sha256": digest(p), "max_tokens": max_tokens, "tokens": t}
        for p, t in zip(probes, tokens, strict=True)]}, indent=1))


# --------------------------------------------------------------------------- #
# the soak
# --------------------------------------------------------------------------- #
def served_model(base: str) -> tuple[str, int]:
    """The served model's name and max_model_len."""
    with urllib.request.urlopen(f"{base}/v1/models", timeout=30) as r:
        model = json.loads(r.read())["data"][0]
    return model["id"], model["max_model_len"]


async def _soak(args, target: traffic.Target, mix: traffic.Mix
                ) -> tuple[traffic.Tally, traffic.Watch, float]:
    tally, watched = traffic.Tally(), traffic.Watch()
    stop = asyncio.Event()
    watcher = asyncio.create_task(traffic.watch(
        target.base, stop, watched, args.health_interval_s, args.health_timeout_s))
    reporter = asyncio.create_task(_progress(stop, tally, watched))
    start = time.monotonic()
    # After the deadline the clients send nothing new and finish what they sent.
    await asyncio.gather(*(
        traffic.client(i, args.seed, start + args.duration_s, mix, target, tally,
                       args.request_timeout_s) for i in range(args.concurrency)))
    elapsed = time.monotonic() - start
    stop.set()
    await asyncio.gather(watcher, reporter)
    return tally, watched, elapsed


async def _progress(stop: asyncio.Event, tally: traffic.Tally,
                    watched: traffic.Watch, every_s: float = 30.0) -> None:
    start = time.monotonic()
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except TimeoutError:
            print(f"soak {time.monotonic() - start:.0f} s: sent "  # noqa: T201
                  f"{sum(tally.sent.values())}, problems {tally.num_problems}, "
                  f"health failures {len(watched.failures)}, peaks {watched.peaks}",
                  flush=True)


def wait_idle(base: str, timeout_s: float) -> dict[str, float]:
    """The idle gauges once all are 0, or as they stand after ``timeout_s``
    (a bound for a hang: finished requests reach the worker within a step)."""
    deadline = time.monotonic() + timeout_s
    while True:
        metrics = scrape(base)
        gauges = {k: metrics.get(k) for k in traffic.IDLE_GAUGES}
        if all(v == 0 for v in gauges.values()) or time.monotonic() > deadline:
            return gauges
        time.sleep(0.5)


def check(ok: bool | None, detail: str) -> dict:
    return {"pass": ok, "detail": detail}


def criteria(result: dict) -> dict[str, dict]:
    t, w, probes = result["traffic"], result["watch"], result["probes"]
    out = {}
    dead = result["spec_server"].get("dead_engine_lines", [])
    answered = probes.get("after") is not None
    polled = w["health_polls"] > 0 and w["num_health_failures"] == 0
    out["no_engine_death"] = check(
        polled and answered and not dead,
        f"{w['health_polls']} /health polls, {w['num_health_failures']} not 200; "
        f"probes answered after the soak: {answered}; dead-engine log lines: "
        f"{dead[:3]}")
    fives = {s: n for s, n in t["statuses"].items() if s.startswith("5")}
    out["no_5xx"] = check(not fives, f"statuses {t['statuses']}")
    malformed = t["malformed"]
    wrong = {name: m["statuses"] for name, m in malformed.items()
             if set(m["statuses"]) != {str(m["expect"])}}
    out["malformed_answered"] = check(
        bool(malformed) and not wrong,
        f"{t['sent'].get('malformed', 0)} malformed requests over {len(malformed)} "
        f"cases; answered otherwise than expected: {wrong}")
    others = [p for p in t["problems"] if p["kind"] != "malformed"]
    num_others = t["num_problems"] - (len(t["problems"]) - len(others))
    ok = sum(n for k, n in t["outcomes"].items() if k.endswith(":ok"))
    out["requests_complete"] = check(
        ok > 0 and num_others == 0 and t["sent"].get("abort", 0) > 0,
        f"{ok} completed in full, {t['sent'].get('abort', 0)} closed by their "
        f"client, {num_others} problems: {others[:3]}")
    end = result.get("gauges_at_end")
    out["idle_at_end"] = check(end is not None and all(v == 0 for v in end.values()),
                               f"{end or result.get('after_soak_error')}")
    preemptions = result.get("counters", {}).get("vllm:num_preemptions_total", 0)
    out["preempted"] = check(preemptions > 0, f"{preemptions:.0f} preemptions")
    before, after = probes.get("before"), probes.get("after")
    out["probes_stable"] = check(
        before is not None and before == after,
        f"{_differing(before, after)} of {PROBES} probes differ after the soak")
    reference = probes.get("reference")
    if probes.get("plain") == "not applicable":
        out["probes_match_plain"] = check(None, probes["plain_why"])
    else:
        out["probes_match_plain"] = check(
            reference is not None and before == reference,
            f"{_differing(before, reference)} of {PROBES} probes differ from "
            f"{probes.get('plain')}")
    return out


def _differing(a, b) -> int | str:
    if a is None or b is None:
        return "all"
    return sum(x != y for x, y in zip(a, b, strict=True))


def device_slug(meta: dict) -> str:
    """"h100", "h200", "cpu": the device in a result file's name."""
    name = meta["hardware"]["device"]
    if name.startswith("CPU"):
        return "cpu"
    found = re.search(r"\b([A-Z]\d{2,4}[A-Z]?)\b", name)
    return (found.group(1) if found else re.sub(r"\W+", "-", name)).lower()


def run(args, result: dict, out: Path, logs: Path) -> None:
    """The phases, recording into ``result`` (written to ``out``) as they end."""
    from transformers import AutoTokenizer

    def save() -> None:
        out.write_text(json.dumps(result, indent=1))

    phases = result["phases_s"]
    started = time.monotonic()

    def phase(name: str) -> None:
        nonlocal started
        phases[name] = round(time.monotonic() - started, 1)
        started = time.monotonic()
        save()

    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    probes = probe_prompts(tok, args.probe_lens)
    pool = prompts.long_prompts(tok, args.max_input_len, args.pool_docs, start=100)
    rec = result["probes"]
    rec.update(lens=args.probe_lens, output_len=args.probe_output_len,
               sampling="top_k 1, temperature 1, a seed each" if args.seeded_probes
               else "temperature 0")
    if args.acceptance_length > 0:
        rec.update(plain="not applicable", plain_why=(
            f"synthetic acceptance (length {args.acceptance_length}) accepts "
            "draft tokens by a coin flip: the output is not plain decoding's"))
    elif args.reference is not None:
        ref = read_reference(args.reference, probes, args.probe_output_len)
        rec.update(plain=f"--reference {args.reference} ({ref['source']})",
                   reference=[p["tokens"] for p in ref["probes"]])
    else:
        with serve(serve_args(args, "plain"), logs / "plain.log",
                   args.startup_timeout_s) as plain:
            result["plain_server"] = {"command": shlex.join(plain.command),
                                      "startup_s": round(plain.startup_s, 1)}
            model, _ = served_model(plain.base)
            rec.update(plain="a plain server (the same flags without speculation)",
                       reference=run_probes(plain.base, model, probes, args, "plain"))
        result["plain_server"]["forced_stop"] = plain.forced_stop
    phase("prompts_and_reference")

    log = logs / "spec_extend.log"
    spec = result["spec_server"]
    with serve(serve_args(args, "spec_extend"), log, args.startup_timeout_s) as server:
        spec.update(command=shlex.join(server.command),
                    startup_s=round(server.startup_s, 1),
                    async_scheduling=async_scheduling(log))
        phase("spec_extend_start")
        model, max_model_len = served_model(server.base)
        if args.max_input_len + args.max_output_len > max_model_len:
            raise SystemExit(
                f"--max-input-len {args.max_input_len} + --max-output-len "
                f"{args.max_output_len} exceed the server's max_model_len "
                f"{max_model_len}: well-formed requests would be refused; raise "
                "--max-model-len or lower them")
        rec["before"] = run_probes(server.base, model, probes, args, "before")
        phase("probes_before")
        start_metrics = scrape(server.base)
        target = traffic.Target(server.base, model, max_model_len, pool, tok.decode)
        tally, watched, elapsed = asyncio.run(_soak(args, target, _mix(args)))
        result.update(traffic=tally.as_dict(), watch=watched.as_dict(),
                      soak_s=round(elapsed, 1))
        phase("soak_and_drain")
        try:  # a server the soak took down answers none of this: criteria fail
            result["gauges_at_end"] = wait_idle(server.base, args.idle_timeout_s)
            phase("idle_wait")
            rec["after"] = run_probes(server.base, model, probes, args, "after")
            end_metrics = scrape(server.base)
            result["counters"] = {
                **{k: end_metrics.get(k, 0.0) - start_metrics.get(k, 0.0)
                   for k in COUNTERS},
                **counter_deltas(start_metrics, end_metrics)}
            phase("probes_after")
        except (OSError, KeyError, ValueError) as e:
            result["after_soak_error"] = f"{type(e).__name__}: {e}"
    phase("stop")
    text = log.read_text(errors="replace")
    spec.update(forced_stop=server.forced_stop, log_errors=log_errors(log)[:20],
                dead_engine_lines=[ln for ln in text.splitlines()
                                   if DEAD_ENGINE.search(ln)][:5])


def _mix(args) -> traffic.Mix:
    return traffic.Mix(
        min_input_len=args.min_input_len, max_input_len=args.max_input_len,
        max_output_len=args.max_output_len, abort_share=args.abort_share,
        malformed_share=args.malformed_share, abort_max_delay_s=args.abort_max_delay_s)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p, argv, serve_extra = serve_args_parser(__doc__, argv)
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--tokenizer", help="default: --target; with dummy weights it "
                   "must know every id of the model's vocabulary "
                   "(builders pad-tokenizer)")
    p.add_argument("--duration-s", type=float, default=600.0)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--min-input-len", type=int, default=1024)
    p.add_argument("--max-input-len", type=int, default=32768)
    p.add_argument("--max-output-len", type=int, default=512)
    p.add_argument("--abort-share", type=float, default=0.2)
    p.add_argument("--malformed-share", type=float, default=0.05)
    p.add_argument("--abort-max-delay-s", type=float, default=5.0,
                   help="aborts closed by time close within this")
    p.add_argument("--pool-docs", type=int, default=16,
                   help="documents the requests cut their prompts from")
    p.add_argument("--probe-lens", type=int, nargs=PROBES,
                   default=[1024, 2048, 4096, 6144, 8192, 12288, 16384, 24576])
    p.add_argument("--probe-output-len", type=int, default=32)
    p.add_argument("--method", choices=modes.METHODS, default="draft_model",
                   help="vLLM's speculative method the plugin extends (eagle3: "
                   "--draft an EAGLE-3 head)")
    p.add_argument("--num-spec-tokens", type=int, default=4)
    p.add_argument("--acceptance-length", type=float, default=0.0,
                   help="synthetic mean acceptance length; 0: real rejection "
                   "sampling")
    p.add_argument("--spec-extend", default="{}", metavar="JSON",
                   help="the plugin's config (default: its defaults)")
    p.add_argument("--reference", type=Path,
                   help="plain decoding's probe tokens (write_reference) instead "
                   "of a plain server")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--startup-timeout-s", type=float, default=900.0)
    p.add_argument("--request-timeout-s", type=float, default=900.0,
                   help="bounds a hung request")
    p.add_argument("--idle-timeout-s", type=float, default=300.0,
                   help="bounds the wait for the idle gauges after the soak")
    p.add_argument("--health-interval-s", type=float, default=1.0)
    p.add_argument("--health-timeout-s", type=float, default=30.0)
    p.add_argument("--out-dir", type=Path, required=True)
    args = p.parse_args(argv)
    args.serve_args = serve_extra
    args.tokenizer = args.tokenizer or args.target
    args.seeded_probes = args.acceptance_length > 0
    if not 0 < args.min_input_len <= args.max_input_len:
        p.error("need 0 < --min-input-len <= --max-input-len")
    if gap := tokenizer_gap(args.target, args.tokenizer, args.serve_args):
        p.error(gap)
    if gap := modes.plugin_gap(["spec_extend"]):
        p.error(gap)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the running server is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    meta = run_metadata(args, bench="soak")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%MZ")
    name = f"{stamp}_{device_slug(meta)}"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out, logs = args.out_dir / f"{name}.json", args.out_dir / f"{name}_logs"
    result = {"meta": meta, "phases_s": {}, "probes": {}, "spec_server": {}}
    try:
        run(args, result, out, logs)
        result["criteria"] = criteria(result)
        result["pass"] = all(c["pass"] is not False
                             for c in result["criteria"].values())
    except (RuntimeError, OSError) as e:
        result.update(error=f"{type(e).__name__}: {e}", criteria={}, **{"pass": False})
    out.write_text(json.dumps(result, indent=1))
    for key, c in result["criteria"].items():
        mark = {True: "PASS", False: "FAIL", None: "n/a "}[c["pass"]]
        print(f"{mark} {key}: {c['detail']}")  # noqa: T201
    print(f"{'PASS' if result['pass'] else 'FAIL'}: {out}")  # noqa: T201
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
