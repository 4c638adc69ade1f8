"""The soak's traffic (``benchmarks/serve/soak.py``): clients that keep a server busy
with completions, streams and chats of mixed lengths, close some of them at a
random point, slip malformed requests in among them, and a poller of
``/health`` and ``/metrics``.

Each client plans its requests from its own seeded generator (kind, input and
output length, abort point), so a run sends the same requests in the same
order per client; what the server makes of them depends on timing. Outcomes
are tallied (``Tally``); anything a healthy server should not do (a 5xx, a
request cut short, a malformed request accepted, a connection error) is kept
as a ``problem``.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from benchmarks.harness.server import scrape

MAX_PROBLEMS = 50
"""Problems kept in full; the rest are only counted."""
IDLE_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting",
               "vllm:spec_extend_tracked_requests", "vllm:spec_extend_request_slots")
"""Zero on an idle server: no request in the engine, none holding SpecExtend
state (a selection, or a request slot with its buffers and scratch run)."""


@dataclass(frozen=True)
class Mix:
    """What the clients send. Input lengths are log-uniform (as many requests
    per doubling of length), output lengths uniform from 1."""

    min_input_len: int
    max_input_len: int
    max_output_len: int
    abort_share: float
    malformed_share: float
    abort_max_delay_s: float
    """A closed-by-time abort closes at a uniform delay below this."""
    chat_share: float = 0.1
    stream_share: float = 0.5
    sampled_share: float = 0.5
    """Of the well-formed requests, sampled at temperature 1 (else greedy)."""


@dataclass(frozen=True)
class Target:
    """The server, and the token pool requests cut their prompts from."""

    base: str
    model: str
    max_model_len: int
    pool: list[list[int]]
    """Token-id documents of at least ``max_input_len`` tokens each; requests
    that draw the same one share a prefix (prefix-cache hits)."""
    decode: Callable[[list[int]], str]
    """Token ids to text, for chat messages."""


# --------------------------------------------------------------------------- #
# malformed requests
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class Malformed:
    name: str
    path: str
    body: Callable[[Target], bytes]
    expect: int
    """The status vLLM answers with: 400 or 404 (rejected, with a message), or
    200 where vLLM accepts the request as OpenAI's API allows."""


def _completion(t: Target, **fields) -> bytes:
    body = {"model": t.model, "prompt": t.pool[0][:16], "max_tokens": 4, **fields}
    return json.dumps(body).encode()


MALFORMED = (
    Malformed("max_tokens_negative", "/v1/completions",
              lambda t: _completion(t, max_tokens=-1), 400),
    Malformed("max_tokens_string", "/v1/completions",
              lambda t: _completion(t, max_tokens="many"), 400),
    Malformed("prompt_over_max_model_len", "/v1/completions",
              lambda t: _completion(t, prompt=[t.pool[0][0]] * (t.max_model_len + 1)),
              400),
    Malformed("prompt_plus_output_over_max_model_len", "/v1/completions",
              lambda t: _completion(t, prompt=[t.pool[0][0]] * (t.max_model_len - 2),
                                    max_tokens=8), 400),
    Malformed("temperature_string", "/v1/completions",
              lambda t: _completion(t, temperature="hot"), 400),
    Malformed("prompt_object", "/v1/completions",
              lambda t: _completion(t, prompt={"text": "hello"}), 400),
    Malformed("token_id_out_of_vocabulary", "/v1/completions",
              lambda t: _completion(t, prompt=[10**9]), 400),
    Malformed("body_not_json", "/v1/completions", lambda t: b"{not json", 400),
    Malformed("unknown_model", "/v1/completions",
              lambda t: _completion(t, model="no-such-model"), 404),
    Malformed("chat_messages_string", "/v1/chat/completions",
              lambda t: json.dumps({"model": t.model, "messages": "hello",
                                    "max_tokens": 4}).encode(), 400),
    # vLLM's request models accept fields they do not know (OpenAIBaseModel:
    # extra="allow", logged at debug level): served, not refused.
    Malformed("unknown_field", "/v1/completions",
              lambda t: _completion(t, no_such_field={"x": 1}), 200),
)


_SUMMARY = re.compile(r"^\d+ validation errors?:$")


def first_line(text: str) -> str:
    """The error message's first line (vLLM's JSON ``error.message``, else the
    body's), for the result file. vLLM words a request that fails its request
    model as pydantic's summary ("1 validation error:") with the errors on the
    lines after: the first error's field and reason are added to it."""
    try:
        message = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = text
    lines = [ln.strip() for ln in str(message).splitlines() if ln.strip()]
    if not lines:
        return ""
    line = lines[0]
    if _SUMMARY.match(line) and len(lines) > 1:
        loc = re.search(r"'loc': \(([^)]*)\)", lines[1])
        msg = re.search(r"'msg': '([^']*)'", lines[1])
        field = ".".join(re.findall(r"'([^']*)'", loc.group(1))) if loc else "?"
        line = f"{line} {field}: {msg.group(1) if msg else lines[1]}"
    return line[:300]


# --------------------------------------------------------------------------- #
# tallies
# --------------------------------------------------------------------------- #
@dataclass
class Tally:
    sent: Counter = field(default_factory=Counter)
    """Requests per kind: complete, stream, chat, abort, malformed."""
    outcomes: Counter = field(default_factory=Counter)
    """"kind:outcome" -> count (ok, closed_before_first_token, ...)."""
    statuses: Counter = field(default_factory=Counter)
    malformed: dict = field(default_factory=dict)
    """Per case: expected status, statuses seen, first lines of the messages."""
    problems: list = field(default_factory=list)
    num_problems: int = 0
    output_tokens: int = 0

    def status(self, status: int) -> None:
        self.statuses[str(status)] += 1

    def problem(self, kind: str, what: str, **detail) -> None:
        self.num_problems += 1
        self.outcomes[f"{kind}:problem"] += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append({"kind": kind, "what": what, **detail})

    def malformed_answer(self, case: Malformed, status: int, text: str) -> None:
        entry = self.malformed.setdefault(
            case.name, {"expect": case.expect, "statuses": Counter(), "messages": []})
        entry["statuses"][str(status)] += 1
        line = first_line(text) if status != 200 else "(served)"
        if line not in entry["messages"] and len(entry["messages"]) < 3:
            entry["messages"].append(line)
        if status != case.expect or (status >= 400 and not line):
            self.problem("malformed", f"{case.name}: {status}, expected "
                         f"{case.expect}", message=line)
        else:
            self.outcomes["malformed:as_expected"] += 1

    def as_dict(self) -> dict:
        malformed = {k: {**v, "statuses": dict(v["statuses"])}
                     for k, v in sorted(self.malformed.items())}
        return {"sent": dict(self.sent),
                "outcomes": dict(sorted(self.outcomes.items())),
                "statuses": dict(self.statuses), "malformed": malformed,
                "output_tokens": self.output_tokens, "num_problems": self.num_problems,
                "problems": self.problems}


@dataclass
class Watch:
    """What the poller saw: /health answers and the gauges' peaks."""

    polls: int = 0
    failures: list = field(default_factory=list)
    max_health_s: float = 0.0
    peaks: dict = field(default_factory=lambda: dict.fromkeys(IDLE_GAUGES, 0.0))

    def as_dict(self) -> dict:
        return {"health_polls": self.polls, "health_failures": self.failures[:20],
                "num_health_failures": len(self.failures),
                "max_health_s": round(self.max_health_s, 3), "gauge_peaks": self.peaks}


# --------------------------------------------------------------------------- #
# requests
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class Plan:
    kind: str  # complete | stream | chat | abort | malformed
    doc: int = 0
    input_len: int = 0
    max_tokens: int = 0
    temperature: float = 0.0
    stream: bool = False
    chat: bool = False
    close_after_tokens: int | None = None
    close_after_s: float | None = None
    case: Malformed | None = None


def plan(rng: random.Random, mix: Mix, target: Target) -> Plan:
    """The next request of a client."""
    draw = rng.random()
    if draw < mix.malformed_share:
        return Plan("malformed", case=rng.choice(MALFORMED))
    aborted = draw < mix.malformed_share + mix.abort_share
    chat = rng.random() < mix.chat_share
    # A chat's text is tokenized again and wrapped in the template: half the
    # longest input keeps it within max_model_len.
    longest = mix.max_input_len // 2 if chat else mix.max_input_len
    input_len = round(math.exp(rng.uniform(math.log(mix.min_input_len),
                                           math.log(max(longest, mix.min_input_len)))))
    max_tokens = rng.randint(1, mix.max_output_len)
    common = dict(doc=rng.randrange(len(target.pool)), input_len=input_len,
                  max_tokens=max_tokens, chat=chat,
                  temperature=1.0 if rng.random() < mix.sampled_share else 0.0)
    if not aborted:
        stream = rng.random() < mix.stream_share
        kind = "chat" if chat else "stream" if stream else "complete"
        return Plan(kind, stream=stream, **common)
    # Closed after some tokens, or at a time that may fall in the queue or
    # prefill, streamed or not (a plain request is cancelled).
    way = rng.randrange(3)
    if way == 0 and max_tokens > 1:
        return Plan("abort", stream=True,
                    close_after_tokens=rng.randint(1, max_tokens - 1), **common)
    return Plan("abort", stream=way != 2,
                close_after_s=rng.uniform(0, mix.abort_max_delay_s), **common)


def _body(p: Plan, target: Target) -> dict:
    ids = target.pool[p.doc][: p.input_len]
    body = {"model": target.model, "max_tokens": p.max_tokens,
            "temperature": p.temperature, "ignore_eos": True}
    if p.chat:
        body["messages"] = [{"role": "user", "content": target.decode(ids)}]
    else:
        body["prompt"] = ids
    if p.stream:
        body.update(stream=True, stream_options={"include_usage": True},
                    return_token_ids=True)
    return body


@dataclass
class _Progress:
    """How far a request got; read when the client closes it by time."""

    tokens: int = 0
    usage: dict | None = None
    closed: bool = False


async def _read_stream(resp, progress: _Progress,
                       close_after_tokens: int | None) -> None:
    async for raw in resp.content:
        line = raw.decode(errors="replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        chunk = json.loads(data)
        progress.usage = chunk.get("usage") or progress.usage
        for choice in chunk.get("choices") or []:
            ids = choice.get("token_ids")
            # A chunk without ids is one engine step: at least a token.
            progress.tokens += len(ids) if ids is not None else 1
        if close_after_tokens is not None and progress.tokens >= close_after_tokens:
            resp.close()  # the server sees the client leave mid-stream
            progress.closed = True
            return


async def _exchange(session, url: str, body: dict, p: Plan,
                    progress: _Progress) -> tuple[int, str]:
    """(status, the error body)."""
    async with session.post(url, json=body) as resp:
        if resp.status != 200:
            return resp.status, await resp.text()
        if p.stream:
            await _read_stream(resp, progress, p.close_after_tokens)
        else:
            progress.usage = (await resp.json()).get("usage")
        return resp.status, ""


async def send(session: aiohttp.ClientSession, p: Plan, target: Target,
               tally: Tally) -> None:
    """One planned request, its outcome tallied."""
    tally.sent[p.kind] += 1
    if p.case is not None:
        async with session.post(f"{target.base}{p.case.path}", data=p.case.body(target),
                                headers={"Content-Type": "application/json"}) as resp:
            text = await resp.text()
        tally.status(resp.status)
        tally.malformed_answer(p.case, resp.status, text)
        return
    path = "/v1/chat/completions" if p.chat else "/v1/completions"
    progress = _Progress()
    exchange = _exchange(session, f"{target.base}{path}", _body(p, target), p, progress)
    try:
        status, text = await asyncio.wait_for(exchange, p.close_after_s)
    except TimeoutError:
        if p.close_after_s is None:
            raise  # the client's own timeout: a hang, not an abort
        # wait_for cancelled the exchange, which closed the connection.
        where = "during_decode" if progress.tokens else "before_first_token"
        tally.outcomes[f"abort:closed_{where}"] += 1
        return
    tally.status(status)
    if status != 200:
        tally.problem(p.kind, f"status {status}", message=first_line(text))
        return
    got = (progress.usage or {}).get("completion_tokens", progress.tokens)
    tally.output_tokens += got
    if progress.closed:
        tally.outcomes["abort:closed_during_decode"] += 1
    elif got != p.max_tokens:
        tally.problem(p.kind, f"{got} of {p.max_tokens} tokens",
                      input_len=p.input_len, stream=p.stream)
    elif p.kind == "abort":
        tally.outcomes["abort:finished_before_close"] += 1
    else:
        tally.outcomes[f"{p.kind}:ok"] += 1


async def client(index: int, seed: int, deadline: float, mix: Mix, target: Target,
                 tally: Tally, timeout_s: float) -> None:
    """Requests one after another until ``deadline`` (monotonic seconds)."""
    rng = random.Random(seed * 10_000 + index)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while time.monotonic() < deadline:
            p = plan(rng, mix, target)
            try:
                await send(session, p, target, tally)
            except (aiohttp.ClientError, TimeoutError, ValueError) as e:
                tally.problem(p.kind, f"{type(e).__name__}: {e}"[:300],
                              input_len=p.input_len)


async def watch(base: str, stop: asyncio.Event, record: Watch, interval_s: float,
                timeout_s: float) -> None:
    """/health every ``interval_s`` until ``stop``, and the gauges' peaks."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while not stop.is_set():
            start = time.monotonic()
            try:
                async with session.get(f"{base}/health") as resp:
                    status = resp.status
            except (aiohttp.ClientError, TimeoutError) as e:
                status = f"{type(e).__name__}: {e}"[:200]
            record.polls += 1
            record.max_health_s = max(record.max_health_s, time.monotonic() - start)
            if status != 200:
                record.failures.append({"at_s": round(start, 1), "status": status})
            try:
                gauges = await asyncio.to_thread(scrape, base)
                for key in IDLE_GAUGES:
                    record.peaks[key] = max(record.peaks[key], gauges.get(key, 0.0))
            except OSError:
                pass  # /health says whether the server is there
            try:
                await asyncio.wait_for(stop.wait(), interval_s)
            except TimeoutError:
                pass
