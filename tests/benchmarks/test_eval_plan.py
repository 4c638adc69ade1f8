"""What benchmarks/longinput/eval_longinput.py plans to run (no engine)."""

from __future__ import annotations

import pytest

from benchmarks.longinput import eval_longinput, inputs, needle
from vllm_specextend.config import SpecExtendConfigError


@pytest.fixture
def plan(tiny_target, tiny_tokenizer, long_prompts):
    def make(*argv):
        args = eval_longinput.parse_args(
            ["run", "--target", tiny_target, "--draft", tiny_target, "--out", "x.json",
             "--num-prompts", "2", *argv])
        return args, eval_longinput.plan(args, tiny_tokenizer)

    return make


def test_eval_runs_every_mode_on_the_same_exact_length_prompts(plan, tiny_tokenizer):
    args, runs = plan("--lengths", "512", "4096", "--spec-extend", '{"top_k": 8}')
    assert args.max_model_len == 4096  # the tiny models' positions
    assert len(runs) == 2 * 2 * 4
    by_key = {}
    for run in runs:
        by_key.setdefault((run.dataset, run.length), []).append(run)
        # 4096 + 256 new tokens would not fit: the prompt gives way, and
        # leaves K + 1 positions so that the drafter runs to the last step.
        want = 512 if run.length == 512 else 4096 - 256 - 5
        assert all(len(p) == want for p in run.prompts)
        assert run.config is None or run.config == {
            **eval_longinput.DEFAULT_SPEC_EXTEND, "top_k": 8, "policy": run.mode}
    for group in by_key.values():
        assert [r.mode for r in group] == ["none", "draft_model", "streaming", "cmr"]
        assert all(r.prompts == group[0].prompts for r in group)
    head = inputs.encode(tiny_tokenizer, inputs.SUMMARY_HEAD)
    tail = inputs.encode(tiny_tokenizer, inputs.SUMMARY_TAIL)
    prompt = runs[0].prompts[0]
    assert prompt[:len(head)] == head and prompt[-len(tail):] == tail
    assert runs[0].prompts[0] != runs[0].prompts[1]


def test_cost_reuses_eval_runs_and_otherwise_runs_full_kv_and_cmr(plan):
    _, runs = plan("--tasks", "eval", "cost", "--lengths", "512")
    assert not [r for r in runs if r.task == "cost"]
    _, runs = plan("--tasks", "cost", "--lengths", "512", "1024", "--cost-prompts", "3")
    assert [(r.mode, r.length, len(r.prompts)) for r in runs] == [
        ("draft_model", 512, 3), ("cmr", 512, 3),
        ("draft_model", 1024, 3), ("cmr", 1024, 3)]
    assert {r.dataset for r in runs} == {"govreport"}


def test_sweep_skips_chunks_that_are_not_whole_blocks(plan, capsys):
    _, runs = plan("--tasks", "sweep", "--sweep-length", "2048",
                   "--sweep-chunk-sizes", "16", "32", "64", "--sweep-top-k", "8", "16",
                   "--sweep-retrieve-every", "1", "4")
    assert "[16] skipped" in capsys.readouterr().err  # CPU block size 32
    assert len(runs) == 2 * 2 * 2
    configs = [r.config for r in runs]
    assert {c["chunk_size"] for c in configs} == {32, 64}
    assert all(c["sink_tokens"] % c["chunk_size"] == 0 for c in configs)
    assert all(c["policy"] == "cmr" for c in configs)
    assert all(r.mode == "cmr" for r in runs)


def test_needle_runs_hold_the_key_at_each_depth(plan, tiny_tokenizer):
    _, runs = plan("--tasks", "needle", "--modes", "none", "cmr",
                   "--needle-lengths", "1024", "--needle-depths", "0.25", "0.75",
                   "--needle-prompts", "2")
    assert [(r.mode, r.depth) for r in runs] == [("cmr", 0.25), ("cmr", 0.75)]
    for run in runs:
        assert run.batch_size == 1 and run.max_new_tokens == 24
        for prompt, key in zip(run.prompts, run.keys, strict=True):
            assert len(prompt) == 1024
            assert key in tiny_tokenizer.decode(prompt)
            assert tiny_tokenizer.decode(prompt).endswith(needle.QUESTION)
        assert run.keys[0] != run.keys[1]


def test_bad_spec_extend_fails_before_any_engine(tiny_target):
    with pytest.raises(SpecExtendConfigError, match="top_k"):
        eval_longinput.parse_args(["run", "--target", tiny_target, "--draft",
                                   tiny_target, "--out", "x.json",
                                   "--spec-extend", '{"top_k": 0}'])


def test_compact_modes_get_their_own_engine_and_config(plan):
    _, runs = plan("--lengths", "512", "--modes", "cmr", "cmr_compact",
                   "streaming_compact")
    kinds = {r.mode: eval_longinput.engine.engine_kind(r.mode) for r in runs}
    assert kinds == {"cmr": "spec_extend", "cmr_compact": "spec_extend_compact",
                     "streaming_compact": "spec_extend_compact"}
    configs = {r.mode: r.config for r in runs}
    assert "compact_positions" not in configs["cmr"]
    assert configs["cmr_compact"]["policy"] == "cmr"
    assert configs["streaming_compact"] == {**configs["cmr_compact"],
                                            "policy": "streaming"}
    assert configs["cmr_compact"]["compact_positions"] is True


def test_self_draft_modes_share_one_engine_and_run_each_working_set(plan):
    _, runs = plan("--lengths", "512", "--datasets", "pg19", "--modes", "self_full",
                   "self_streaming", "self_cmr", "--working-sets", "256", "512")
    assert {eval_longinput.engine.engine_kind(r.mode) for r in runs} == {"self_draft"}
    got = sorted((r.mode, eval_longinput.report.working_set(r.config)) for r in runs)
    assert got == [("self_cmr", 256), ("self_cmr", 512), ("self_full", None),
                   ("self_streaming", 256), ("self_streaming", 512)]
    for r in runs:
        assert r.config["self_draft"] is True
        assert r.config["policy"] == r.mode.removeprefix("self_")
    cmr512 = next(r.config for r in runs if r.mode == "self_cmr"
                  and r.config["top_k"] == 11)
    assert (cmr512["recent_tokens"], cmr512["sink_tokens"]) == (128, 32)


def test_window_share_moves_the_split_between_window_and_chunks(plan):
    _, runs = plan("--lengths", "512", "--datasets", "pg19", "--modes", "self_cmr",
                   "--working-sets", "512", "--window-share", "0.5")
    (run,) = runs
    # 512 = 32 sinks + a 256-token window + 7 chunks of 32.
    assert (run.config["recent_tokens"], run.config["top_k"]) == (256, 7)
    assert eval_longinput.report.working_set(run.config) == 512


def test_self_draft_modes_need_no_draft(tiny_target):
    args = eval_longinput.parse_args(["run", "--target", tiny_target, "--out", "x.json",
                                      "--modes", "none", "self_cmr"])
    assert args.draft is None
    with pytest.raises(SystemExit):
        eval_longinput.parse_args(["run", "--target", tiny_target, "--out", "x.json",
                                   "--modes", "cmr"])


def test_working_sets_must_split_into_whole_chunks(tiny_target):
    with pytest.raises(ValueError, match="whole 32-token chunks"):
        eval_longinput.parse_args(["run", "--target", tiny_target, "--out", "x.json",
                                   "--modes", "self_cmr", "--working-sets", "300"])


def test_an_engine_starts_with_its_largest_compaction_scratch(plan):
    """reconfigure can shrink the working set of a compacting engine, not
    grow the scratch it was started with: start with the largest."""
    _, runs = plan("--lengths", "2048", "--modes", "cmr_compact", "streaming_compact",
                   "--working-sets", "256", "1024", "512")
    start = eval_longinput.starting_config(runs)
    assert eval_longinput.report.working_set(start) == 1024
    assert eval_longinput.starting_config([]) is None


def test_copy_tasks_run_every_mode_and_scoring_layer_on_the_same_cases(plan):
    _, runs = plan("--tasks", "quote", "edit", "--copy-sources", "govreport",
                   "--copy-lengths", "2048", "--copy-prompts", "2", "--modes", "none",
                   "self_streaming", "self_cmr", "ngram", "--working-sets", "512",
                   "--score-layers", "-1", "1")
    for task in ("quote", "edit"):
        mine = [r for r in runs if r.task == task]
        got = [(r.mode, eval_longinput.report.engine_score_layer({"config": r.config}))
               for r in mine]
        # The window ranks nothing: it runs once, on the first layer's engine.
        assert got == [("none", None), ("self_streaming", -1), ("self_cmr", -1),
                       ("self_cmr", 1), ("ngram", None)]
        for r in mine:
            assert (r.dataset, r.length, r.batch_size, r.max_new_tokens) == (
                "govreport", 2048, 1, 128)
            assert r.stop == ["\n\n"]  # an answer is one paragraph
            assert r.prompts == mine[0].prompts and r.cases == mine[0].cases
            assert [c.task for c in r.cases] == [task, task]
            assert all(len(p) == 2048 for p in r.prompts)
    groups = eval_longinput.engines(runs)
    # Plain decoding first (the screen learns from it), a self_draft engine per
    # scoring layer (fixed at start-up), vLLM's ngram with no plugin.
    assert list(groups) == [("none", None), ("self_draft", -1), ("self_draft", 1),
                            ("ngram", None)]
    assert [r.mode for r in groups[("self_draft", 1)]] == ["self_cmr", "self_cmr"]
    assert all(r.config is None for r in groups[("ngram", None)])


def test_ngram_needs_no_draft_and_passes_prompt_lookup(tiny_target, monkeypatch):
    import vllm

    args = eval_longinput.parse_args(["run", "--target", tiny_target, "--out", "x.json",
                                      "--modes", "none", "ngram", "--ngram-max", "5",
                                      "--ngram-min", "3"])
    built = {}
    monkeypatch.setattr(vllm, "LLM", lambda **kwargs: built.update(kwargs))
    eval_longinput.engine.build(eval_longinput.settings(args), "ngram")
    assert built["speculative_config"] == {
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 5,
        "prompt_lookup_min": 3}
    assert "additional_config" not in built  # the plugin stays off


class FakeEngine:
    """Steps that grow one request's output as ``growth`` says (tokens per
    step; 0: a step that wrote nothing, as a prefill chunk)."""

    def __init__(self, growth):
        self.growth = list(growth)
        self.tokens: list[int] = []

    def add_request(self, request_id, prompt, params):
        self.id = request_id
        return request_id

    def has_unfinished_requests(self):
        return bool(self.growth)

    def step(self):
        from types import SimpleNamespace

        self.tokens += range(len(self.tokens), len(self.tokens) + self.growth.pop(0))
        output = SimpleNamespace(token_ids=list(self.tokens))
        return [SimpleNamespace(request_id=self.id, outputs=[output])]


def test_generate_counts_the_target_forwards_after_the_first_token():
    from types import SimpleNamespace

    engine = FakeEngine([0, 0, 1, 3, 1, 5, 0, 2])  # prefill chunks, then decode
    batch = eval_longinput.engine.generate(SimpleNamespace(llm_engine=engine),
                                           [[1, 2, 3]], None)
    assert batch.outputs == [list(range(12))]
    # Four forwards wrote the 11 tokens after the first (2.75 each); the
    # steps that wrote nothing were no forwards of this request's decode.
    assert batch.forwards == [4]
    assert batch.decode_tokens == 11
