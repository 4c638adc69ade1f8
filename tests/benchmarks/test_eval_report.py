"""Results merging, the lossless check and tables of the long-input evaluation."""

from __future__ import annotations

from benchmarks.longinput import report


def run_row(mode, outputs, tok_s, dataset="pg19", length=2048, task="eval", **extra):
    prompts = [[1, 2, 3], [4, 5, 6]]
    row = {
        "task": task, "dataset": dataset, "length": length, "prompt_len": length,
        "mode": mode, "config": None, "mean_accepted_length": 1.0,
        "acceptance_rate": None, "decode_tok_s": tok_s, "e2e_tok_s": tok_s / 2,
        "draft_step_ms": None, "spec_extend_stats": None,
        "prompt_hashes": [report.token_hash(p) for p in prompts],
        "output_hashes": [report.token_hash(o) for o in outputs],
    }
    row.update(extra)
    return row


STATS = {"retrievals": 10, "retrieval_steps": 5, "view_rows": 40, "decode_rows": 50,
         "draft_context_tokens": 25_000, "full_context_tokens": 100_000,
         "scoring_seconds": 0.002}


def test_token_hash_is_stable_and_order_sensitive():
    assert report.token_hash([1, 2, 3]) == report.token_hash([1, 2, 3])
    assert report.token_hash([1, 2, 3]) != report.token_hash([3, 2, 1])
    assert report.token_hash([1, 23]) != report.token_hash([12, 3])


def test_mismatches_count_outputs_that_differ_from_plain_decoding():
    rows = [
        run_row("none", [[7, 8], [9, 9]], 100.0),
        run_row("draft_model", [[7, 8], [9, 9]], 150.0),
        run_row("cmr", [[7, 8], [9, 0]], 180.0),
        run_row("cmr", [[7, 8], [9, 9]], 180.0, dataset="govreport",
                prompt_hashes=["aaaa", "bbbb"]),  # no plain run of these prompts
    ]
    report.count_mismatches(rows)
    assert [r.get("mismatches") for r in rows] == [None, 0, 1, None]


def test_merge_checks_runs_against_plain_decoding_from_another_file():
    plain = {"meta": {"date_utc": "a"}, "rows": [run_row("none", [[1], [2]], 10.0)]}
    spec = {"meta": {"date_utc": "b"}, "rows": [run_row("cmr", [[1], [3]], 20.0)]}
    merged = report.merge([plain, spec])
    assert [r["mode"] for r in merged["rows"]] == ["none", "cmr"]
    assert merged["rows"][1]["mismatches"] == 1
    assert merged["meta"]["date_utc"] == "a"
    assert merged["meta"]["merged"] == [{"date_utc": "b"}]


def test_merge_keeps_the_latest_of_a_repeated_run():
    first = run_row("cmr", [[1], [2]], 10.0)
    again = run_row("cmr", [[1], [2]], 20.0)
    other = run_row("streaming", [[1], [2]], 30.0)
    merged = report.merge([{"meta": {}, "rows": [first, other]},
                           {"meta": {}, "rows": [again]}])
    assert [(r["mode"], r["decode_tok_s"]) for r in merged["rows"]] == [
        ("cmr", 20.0), ("streaming", 30.0)]


def test_merge_keeps_every_screened_passkey_case():
    # Screened cases hold no hashes: each haystack's key tells them apart.
    def screened(key):
        return run_row("self_cmr", [], 0.0, task="needle", depth=0.5, key=key,
                       prompt_hashes=[], output_hashes=[], screened=True)
    merged = report.merge([{"meta": {}, "rows": [screened("11111"), screened("22222")]},
                           {"meta": {}, "rows": [screened("33333")]}])
    assert sorted(r["key"] for r in merged["rows"]) == ["11111", "22222", "33333"]


def table_rows(table: str) -> list[list[str]]:
    lines = table.splitlines()[2:]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def test_eval_table_orders_modes_and_computes_speedup_and_context_share():
    rows = [
        run_row("cmr", [[1], [2]], 150.0, spec_extend_stats=STATS,
                mean_accepted_length=2.5, acceptance_rate=0.375,
                accepted_length_ci95=[2.25, 2.75], config={"top_k": 4},
                coverage={"row_steps": 40, "top_held": 0.875, "mass_held": 0.5}),
        run_row("none", [[1], [2]], 100.0),
    ]
    report.count_mismatches(rows)
    got = table_rows(report.eval_table(rows))
    assert [line[3] for line in got] == ["none", "cmr"]
    # working set, accepted length, its interval, acceptance rate, decode, e2e,
    # speedup, context %, top chunk held %, attention held %, mismatches
    # cmr scored with the final layer (a config from before score_layer: -1)
    assert got[1][4:] == ["–", "-1", "2.50", "2.25–2.75", "0.38", "150.00", "75.00",
                          "1.50", "25.00", "87.50", "50.00", "0"]
    # plain decoding: no scoring layer, interval, coverage or mismatch count
    assert got[0][5] == "–" and got[0][11] == "1.00" and got[0][7] == "–"
    assert got[0][13:] == ["–"] * 3


def test_rows_of_one_mode_sort_by_working_set():
    config = {"policy": "cmr", "sink_tokens": 32, "chunk_size": 32,
              "recent_tokens": 128}
    rows = []
    for top_k in (11, 4):
        row = run_row("self_cmr", [[1], [2]], 100.0, config={**config, "top_k": top_k})
        row["working_set"] = report.working_set(row["config"])
        rows.append(row)
    got = table_rows(report.eval_table(rows))
    assert [line[4] for line in got] == ["288", "512"]
    assert report.working_set({**config, "top_k": 4, "policy": "full"}) is None


def test_cost_table_puts_cmr_next_to_full_kv():
    rows = [
        run_row("draft_model", [[1], [2]], 120.0, draft_step_ms=0.8),
        run_row("cmr", [[1], [2]], 130.0, task="cost", draft_step_ms=0.6,
                spec_extend_stats=STATS),
    ]
    got = table_rows(report.cost_table(rows))
    assert got == [["pg19", "2048", "0.80", "0.60", "0.40", "0.20", "0.10", "25.00"]]


def needle_row(mode, depth, correct, matched, proposed, consistent=True):
    all_matched = (matched == proposed if proposed else None) if correct else None
    return {"task": "needle", "length": 4096, "depth": depth, "mode": mode,
            "target_correct": correct, "matched": matched, "proposed": proposed,
            "all_matched": all_matched, "replay_consistent": consistent}


def test_needle_summary_scores_the_draft_on_answered_prompts_only():
    rows = [
        needle_row("cmr", 0.5, True, 4, 4),
        needle_row("cmr", 0.5, True, 1, 4),
        needle_row("cmr", 0.5, False, 0, 0, consistent=False),
        needle_row("streaming", 0.5, True, 0, 4),
    ]
    summary = report.needle_summary(rows)
    assert [s["mode"] for s in summary] == ["streaming", "cmr"]
    cmr = summary[1]
    assert cmr["prompts"] == 3
    assert cmr["target_accuracy"] == 2 / 3
    assert cmr["token_match_rate"] == 5 / 8
    assert cmr["all_digits_rate"] == 0.5
    assert cmr["replay_consistent"] is False
    assert cmr["reproduced"] == "1 of 2"
    assert summary[0]["all_digits_rate"] == 0.0


def test_needle_summary_over_depths_pools_each_mode():
    rows = [needle_row("cmr", 0.1, True, 4, 4), needle_row("cmr", 0.5, True, 1, 4),
            needle_row("cmr", 0.7, False, 0, 0), needle_row("streaming", 0.1, True, 0, 4)]
    pooled = report.needle_summary(rows, over_depths=True)
    assert [(s["mode"], s["depth"], s["prompts"]) for s in pooled] == [
        ("streaming", "all", 1), ("cmr", "all", 3)]
    assert pooled[1]["reproduced"] == "1 of 2"
    assert "Over every depth" in report.needle_table(rows)


def test_markdown_has_a_section_per_task_present():
    rows = [run_row("none", [[1], [2]], 100.0),
            run_row("cmr", [[1], [2]], 150.0, spec_extend_stats=STATS,
                    draft_step_ms=1.0)]
    text = report.markdown({"meta": {}, "rows": rows})
    assert "## Accepted length and speed" in text
    assert "## CMR cost" in text
    assert "## Sweep" not in text and "## Passkey" not in text
    assert "counts the bonus token" in text
    assert "shared the GPU" not in text
    # Evaluations run side by side (host_run.sh): the speed columns say so.
    shared = report.markdown({"meta": {"config": {"shared_gpu": True}}, "rows": rows})
    assert "tok/s columns are no speed results" in shared
    # So do merged files where only a later one shared it.
    merged = report.merge([{"meta": {"config": {}}, "rows": rows[:1]},
                           {"meta": {"config": {"shared_gpu": True}}, "rows": rows[1:]}])
    assert "tok/s columns are no speed results" in report.markdown(merged)


def test_scoring_layer_shows_where_it_changed_something():
    cmr = run_row("self_cmr", [[1], [2]], 1.0, config={"score_layer": 21})
    window = run_row("self_streaming", [[1], [2]], 1.0, config={"score_layer": 21})
    probed = run_row("self_streaming", [[1], [2]], 1.0, config={"score_layer": 21},
                     coverage={"row_steps": 1, "top_held": 1.0, "mass_held": 1.0})
    old = run_row("self_cmr", [[1], [2]], 1.0, config={"top_k": 11})
    assert [report.score_layer(r) for r in (cmr, window, probed, old)] == [21, None, 21, -1]
    # A file from before the key and a rerun naming -1 are one run.
    explicit = run_row("self_cmr", [[1], [2]], 2.0, config={"top_k": 11, "score_layer": -1})
    assert report.run_key(old) == report.run_key(explicit)
    assert len(report.merge([{"meta": {}, "rows": [old]},
                             {"meta": {}, "rows": [explicit]}])["rows"]) == 1
