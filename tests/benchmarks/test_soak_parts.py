"""The soak's parts that need no server: its criteria fail on what they name,
its traffic plans what its options say, malformed answers are judged by their
status and message, and a reference recorded for other probes is refused."""

from __future__ import annotations

import json
import random

import pytest

from benchmarks.harness import traffic
from benchmarks.serve import soak

IDLE = dict.fromkeys(traffic.IDLE_GAUGES, 0.0)


def _passing() -> dict:
    """A result whose every criterion passes."""
    tally = traffic.Tally()
    tally.sent.update(complete=5, abort=2, malformed=1)
    tally.outcomes.update({"complete:ok": 5, "abort:closed_during_decode": 2})
    tally.statuses.update({"200": 5, "400": 1})
    tally.malformed_answer(traffic.MALFORMED[0], 400, json.dumps(
        {"error": {"message": "max_tokens must be at least 1, got -1."}}))
    watch = traffic.Watch(polls=30)
    probes = [[1, 2], [3, 4]]
    return {
        "traffic": tally.as_dict(), "watch": watch.as_dict(),
        "probes": {"before": probes, "after": probes, "reference": probes,
                   "plain": "a plain server"},
        "spec_server": {"dead_engine_lines": []},
        "gauges_at_end": dict(IDLE),
        "counters": {"vllm:num_preemptions_total": 3.0},
    }


def _failed(result: dict) -> set[str]:
    return {k for k, c in soak.criteria(result).items() if c["pass"] is False}


def test_a_clean_run_passes_every_criterion():
    criteria = soak.criteria(_passing())
    assert all(c["pass"] is True for c in criteria.values()), criteria


@pytest.mark.parametrize("spoil, fails", [
    (lambda r: r["watch"].update(num_health_failures=1), "no_engine_death"),
    (lambda r: r["spec_server"].update(dead_engine_lines=["EngineDeadError"]),
     "no_engine_death"),
    (lambda r: r["probes"].update(after=None), "no_engine_death"),
    # Gone after the soak: nothing read back.
    (lambda r: [r.pop("gauges_at_end"), r.pop("counters"), r["probes"].pop("after")],
     "idle_at_end"),
    (lambda r: r["traffic"]["statuses"].update({"500": 1}), "no_5xx"),
    (lambda r: r["traffic"]["malformed"]["max_tokens_negative"]["statuses"].update(
        {"200": 1}), "malformed_answered"),
    (lambda r: r["traffic"].update(num_problems=1, problems=[
        {"kind": "stream", "what": "3 of 8 tokens"}]), "requests_complete"),
    (lambda r: r["gauges_at_end"].update({"vllm:spec_extend_request_slots": 1.0}),
     "idle_at_end"),
    (lambda r: r["counters"].update({"vllm:num_preemptions_total": 0.0}), "preempted"),
    (lambda r: r["probes"].update(after=[[1, 2], [3, 5]]), "probes_stable"),
    (lambda r: r["probes"].update(reference=[[1, 2], [3, 5]]), "probes_match_plain"),
])
def test_each_criterion_fails_on_what_it_names(spoil, fails):
    result = _passing()
    spoil(result)
    assert fails in _failed(result)


def test_plain_comparison_not_applicable_under_synthetic_acceptance():
    result = _passing()
    result["probes"].update(plain="not applicable", plain_why="synthetic",
                            reference=None)
    criteria = soak.criteria(result)
    assert criteria["probes_match_plain"] == {"pass": None, "detail": "synthetic"}
    assert all(c["pass"] for k, c in criteria.items() if k != "probes_match_plain")


def test_malformed_answers_are_judged_by_status_and_message():
    tally = traffic.Tally()
    case = traffic.MALFORMED[1]  # max_tokens as a string: 400 expected
    pydantic = ("1 validation error:\n  {'type': 'int_parsing', 'loc': ('body', "
                "'max_tokens'), 'msg': 'Input should be a valid integer', "
                "'input': 'many'}")
    tally.malformed_answer(case, 400, json.dumps({"error": {"message": pydantic}}))
    tally.malformed_answer(case, 500, "Internal Server Error")
    tally.malformed_answer(case, 400, json.dumps({"error": {"message": ""}}))
    entry = tally.as_dict()["malformed"][case.name]
    assert entry["statuses"] == {"400": 2, "500": 1}
    assert entry["messages"][0] == ("1 validation error: body.max_tokens: Input "
                                    "should be a valid integer")
    # The 500, and the 400 without a message.
    assert tally.num_problems == 2


def test_plans_follow_the_mix_and_the_seed():
    mix = traffic.Mix(min_input_len=100, max_input_len=1600, max_output_len=8,
                      abort_share=0.2, malformed_share=0.05, abort_max_delay_s=1.0)
    target = traffic.Target("http://x", "m", 2048, [list(range(1600))] * 3, str)
    rng = random.Random(7)
    plans = [traffic.plan(rng, mix, target) for _ in range(4000)]
    again = random.Random(7)
    assert plans == [traffic.plan(again, mix, target) for _ in range(4000)]
    kinds = {k: sum(p.kind == k for p in plans) / len(plans)
             for k in ("abort", "malformed")}
    assert 0.17 < kinds["abort"] < 0.23 and 0.035 < kinds["malformed"] < 0.065
    lens = [p.input_len for p in plans if p.kind != "malformed"]
    assert min(lens) >= 100 and max(lens) <= 1600
    # Log-uniform: as many below 400 (two doublings up from 100) as above.
    assert 0.45 < sum(n < 400 for n in lens) / len(lens) < 0.55
    aborts = [p for p in plans if p.kind == "abort"]
    assert any(p.close_after_tokens for p in aborts)
    assert any(p.close_after_s is not None and not p.stream for p in aborts)
    assert all(p.close_after_tokens is None or p.close_after_tokens < p.max_tokens
               for p in aborts)


def test_a_reference_for_other_probes_is_refused(tmp_path):
    path = tmp_path / "ref.json"
    soak.write_reference(path, [[1, 2, 3]], 8, [[4, 5]], "test")
    assert soak.read_reference(path, [[1, 2, 3]], 8)["probes"][0]["tokens"] == [4, 5]
    with pytest.raises(SystemExit, match="recorded for other probes"):
        soak.read_reference(path, [[1, 2, 4]], 8)
    with pytest.raises(SystemExit, match="recorded for other probes"):
        soak.read_reference(path, [[1, 2, 3]], 16)


@pytest.mark.parametrize("name, slug", [
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
    ("CPU (Intel Xeon)", "cpu")])
def test_device_slug(name, slug):
    assert soak.device_slug({"hardware": {"device": name}}) == slug


def test_server_arguments_come_from_the_soak_flags(tmp_path):
    """The soak's flags make the servers' arguments (bench_serve.serve_args):
    a plain server and one with the plugin over the named method."""
    from benchmarks.serve.bench_serve import serve_args

    args = soak.parse_args(["--target", "T", "--draft", "D", "--out-dir", str(tmp_path),
                            "--spec-extend", '{"top_k": 2}', "--num-spec-tokens", "3",
                            "--", "--block-size", "32"])
    spec = serve_args(args, "spec_extend")
    assert spec[:3] == ["T", "--tokenizer", "T"] and spec[-2:] == ["--block-size", "32"]
    speculative = json.loads(spec[spec.index("--speculative-config") + 1])
    assert speculative == {"num_speculative_tokens": 3, "method": "draft_model",
                           "model": "D"}
    assert json.loads(spec[spec.index("--spec-extend") + 1]) == {"top_k": 2}
    assert "--speculative-config" not in serve_args(args, "plain")
    eagle = soak.parse_args(["--target", "T", "--draft", "H", "--method", "eagle3",
                             "--out-dir", str(tmp_path)])
    flags = serve_args(eagle, "spec_extend")
    assert json.loads(flags[flags.index("--speculative-config") + 1])["method"] == "eagle3"
