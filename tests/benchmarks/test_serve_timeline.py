"""serve_timeline: a run's decode window split at the last first token, from
the per-request records a serving run leaves."""

import json

import pytest

from benchmarks.serve import serve_timeline


def write_run(dir, name, start_times, ttfts, itls, errors=None):
    bench = {"start_times": start_times, "ttfts": ttfts, "itls": itls,
             "output_lens": [len(i) + 1 for i in itls],
             "errors": errors or [""] * len(itls)}
    (dir / "bench").mkdir(parents=True, exist_ok=True)
    (dir / "bench" / name).write_text(json.dumps(bench))


def test_a_burst_splits_into_first_token_spread_and_last_decode(tmp_path):
    # Three requests start together at 10 s; first tokens at +1, +2 and +5 s
    # (a spread of 4 s); the last of them decodes for 3 s, the first for 8 s.
    # The failed request counts nowhere.
    run = tmp_path / "spec_extend"
    write_run(run, "spec_extend_long_c3_run0.json", [10.0] * 4, [1.0, 2.0, 5.0, 0.5],
              [[4.0, 4.0], [1.0, 1.0], [1.5, 1.5], []], errors=["", "", "", "boom"])
    write_run(run, "spec_extend_long_c3_run1.json", [0.0] * 3, [1.0, 2.0, 3.0],
              [[1.0], [1.0], [1.0]])
    result = serve_timeline.timeline([run])
    first, second = result["runs"]
    assert first["first_token_spread_s"] == 4.0
    assert first["last_request_decode_s"] == 3.0
    assert first["decode_s"] == 8.0  # [1, 9] covers [2, 4] and [5, 8]
    assert first["decode_tok_s"] == 6 / 8.0
    assert first["requests"] == [[1.0, 9.0, 3], [2.0, 4.0, 3], [5.0, 8.0, 3]]
    assert second["first_token_spread_s"] == 2.0
    text = serve_timeline.table(result)
    assert "| spec_extend/spec_extend_long_c3 | 2 | 5.5 (3.0–8.0) |" in text
    assert text.rstrip().endswith("| 2.0 (1.0–3.0) | 1.0 (1.0–1.0) |")


def test_a_run_without_tokens_counts_in_no_figure(tmp_path):
    # Run 1's requests all failed: it has no decode window (not one of 0 s,
    # which would pull the median down) and the table says so.
    run = tmp_path / "plain"
    write_run(run, "plain_long_c2_run0.json", [0.0] * 2, [1.0, 2.0], [[1.0], [2.0]])
    write_run(run, "plain_long_c2_run1.json", [0.0] * 2, [1.0, 1.0], [[1.0], [1.0]],
              errors=["boom", "boom"])
    write_run(run, "plain_long_c2_run2.json", [0.0] * 2, [1.0, 2.0], [[3.0], [4.0]])
    result = serve_timeline.timeline([run])
    assert result["runs"][1]["requests"] == []
    text = serve_timeline.table(result)
    # decode windows 3 s and 5 s: median 4.0 over the two runs with tokens
    assert "| plain/plain_long_c2 | 3 (1 without tokens) | 4.0 (3.0–5.0) |" in text


def test_no_runs_is_an_error_that_names_the_directory(tmp_path):
    with pytest.raises(SystemExit, match=str(tmp_path)):
        serve_timeline.timeline([tmp_path])
