"""Copy tasks of the long-input evaluation (benchmarks/longinput/copytasks.py):
the prompts, what their answers must be, and the summary rows (no engine)."""

from __future__ import annotations

import re

import pytest

from benchmarks.longinput import copysummary, copytasks
from benchmarks.longinput.copytasks import replace_word


@pytest.fixture
def data(long_prompts):
    """Skips without ../shared/data (through ``long_prompts``)."""


def body(tokenizer, case) -> str:
    start = case.text_start
    return tokenizer.decode(case.prompt[start:start + case.text_tokens])


@pytest.mark.parametrize("source", ["govreport", "pg19", "pydoc"])
@pytest.mark.parametrize("depth", [0.1, 0.5, 0.9])
def test_quote_holds_its_paragraph_at_the_stated_depth(tiny_tokenizer, data, source,
                                                       depth):
    case = copytasks.copy_case(tiny_tokenizer, "quote", source, 1024, depth, 3)
    assert len(case.prompt) == 1024
    # The paragraph's own tokens start `at` tokens into the text, and `at` is
    # the stated depth of the text.
    assert case.at == round(depth * case.text_tokens)
    para = tiny_tokenizer(case.paragraph, add_special_tokens=False)["input_ids"]
    start = case.text_start + case.at
    assert case.prompt[start:start + len(para)] == para
    assert len(para) == case.paragraph_tokens
    assert 24 <= len(para) <= 96
    text = body(tiny_tokenizer, case)
    assert text.count(case.opening) == 1 and text.count(case.paragraph) == 1
    # The instruction quotes the opening; the answer is primed with it, and
    # what is left to write is the rest of the paragraph.
    prompt = tiny_tokenizer.decode(case.prompt)
    assert copytasks.QUOTE.format(opening=case.opening) in prompt
    assert prompt.endswith("assistant\n" + case.opening)
    assert len(case.opening.split()) == 10
    assert case.paragraph.startswith(case.opening)
    assert case.primed == case.opening
    assert case.primed + case.expected == case.paragraph


@pytest.mark.parametrize("source", ["govreport", "pg19", "pydoc"])
def test_edit_expects_the_paragraph_with_only_the_name_changed(tiny_tokenizer, data,
                                                               source):
    case = copytasks.copy_case(tiny_tokenizer, "edit", source, 1024, 0.4, 5)
    assert len(case.prompt) == 1024
    old, new = case.old, case.new
    assert new in (copytasks.IDENTIFIERS if source == "pydoc" else copytasks.NAMES)
    answer = case.primed + case.expected
    assert answer == replace_word(case.paragraph, old, new)
    # Only the name changed: undoing it gives the input back, and the part
    # the target writes still holds a change.
    assert new not in body(tiny_tokenizer, case)
    assert replace_word(answer, new, old) == case.paragraph
    assert answer != case.paragraph
    assert replace_word(case.expected, new, "\0") != case.expected
    assert case.primed == replace_word(case.opening, old, new)
    # Word by word: the same, or the name and its replacement.
    pieces = [re.split(r"([A-Za-z0-9_]+)", t) for t in (case.paragraph, answer)]
    assert len(pieces[0]) == len(pieces[1])
    changed = {(a, b) for a, b in zip(*pieces, strict=True) if a != b}
    assert changed == {(old, new)}
    prompt = tiny_tokenizer.decode(case.prompt)
    assert copytasks.EDIT.format(opening=case.opening, old=old, new=new) in prompt
    assert prompt.endswith(case.primed)


def test_cases_spread_depths_and_documents(tiny_tokenizer, data):
    cases = copytasks.cases(tiny_tokenizer, "quote", "pydoc", 1024, 5)
    assert [c.depth for c in cases] == [0.1, 0.3, 0.5, 0.7, 0.9]
    assert len({c.paragraph for c in cases}) == 5
    assert copytasks.depths(1) == [0.5]


def test_paragraphs_of_reports_books_and_docs():
    report = ("The agency said so. It was late. " * 20).strip()
    paras = copytasks.paragraphs("govreport", report)
    assert " ".join(paras) == report
    assert all(len(p) >= copytasks.REPORT_PARAGRAPH_CHARS for p in paras[:-1])
    assert all(p.endswith(".") for p in paras)
    book = "First line\nstill first.\n\n\n  Second, indented.  \n \nThird."
    assert copytasks.paragraphs("pg19", book) == [
        "First line\nstill first.", "  Second, indented.", "Third."]


def test_rename_picks_names_not_sentence_starts_or_plain_words():
    para = ("The agency and the NCHS staff met. The NCHS found that the "
            "agency staff agreed with Smith.")
    opening = copytasks.opening_of(para, 4)
    assert opening == "The agency and the"
    # "The" starts sentences only; "agency" is no name; NCHS stands mid-sentence.
    assert copytasks.rename_target("govreport", para, opening) == "NCHS"
    docs = ('Call "get_value()" first. Then "get_value()" returns the '
            "value, and value is cached; the cache holds value.")
    assert copytasks.rename_target(
        "pydoc", docs, copytasks.opening_of(docs, 3)) == "get_value"
    # A name only inside the opening leaves the answer nothing to change.
    assert copytasks.rename_target("govreport", "Ask NCHS and NCHS now. Then go.",
                                   "Ask NCHS and NCHS") is None


def test_answered_needs_the_whole_rest_verbatim_up_to_whitespace(tiny_tokenizer, data):
    case = copytasks.copy_case(tiny_tokenizer, "edit", "govreport", 1024, 0.5, 0)
    assert copytasks.answered(case, case.expected + "\n\nMore text.")
    assert copytasks.answered(case, "  " + "\n".join(case.expected.split(" ")))
    assert not copytasks.answered(case, case.expected[:-5])
    # The unedited paragraph is not the answer.
    unedited = case.paragraph[len(case.opening):]
    assert not copytasks.answered(case, unedited)


def test_the_quoted_span_ends_where_the_answer_leaves_the_text(tiny_tokenizer, data):
    def encode(text):
        return tiny_tokenizer(text, add_special_tokens=False)["input_ids"]

    case = copytasks.copy_case(tiny_tokenizer, "quote", "govreport", 1024, 0.5, 0)
    whole = encode(case.expected + "\n\n")
    got = copytasks.score(case, tiny_tokenizer.decode, whole, 16)
    assert got == {"correct": True, "copied_tokens": len(whole), "kept": True}
    # Paraphrased after a few words: the span is those words' tokens.
    words = case.expected.split(" ")
    head = encode(" ".join(words[:6]))
    out = head + encode(" zqxj zqxj zqxj")
    span = copytasks.copied_tokens(case, tiny_tokenizer.decode, out)
    assert len(head) - 1 <= span <= len(head) + 1
    assert span < len(out)
    got = copytasks.score(case, tiny_tokenizer.decode, out, 16)
    assert not got["correct"] and got["kept"] == (span >= 16)
    assert not copytasks.score(case, tiny_tokenizer.decode, out, span + 1)["kept"]


def test_an_edit_counts_only_past_its_first_renamed_name(tiny_tokenizer, data):
    def encode(text):
        return tiny_tokenizer(text, add_special_tokens=False)["input_ids"]

    case = copytasks.copy_case(tiny_tokenizer, "edit", "govreport", 1024, 0.5, 0)
    renamed = encode(case.expected)
    assert copytasks.score(case, tiny_tokenizer.decode, renamed, 1)["kept"]
    # The model copies the old name: a quote up to there, which does not count.
    unedited = encode(replace_word(case.expected, case.new, case.old))
    got = copytasks.score(case, tiny_tokenizer.decode, unedited, 1)
    assert not got["kept"] and not got["correct"]
    cut = tiny_tokenizer.decode(unedited[:got["copied_tokens"]])
    assert case.old not in cut and case.expected.startswith(cut.rstrip())


def test_runs_of_the_quoted_span_alone_match_plain_decodings_prefix():
    from benchmarks.longinput import report

    plain = {"mode": "none", "prompt_hashes": ["a", "b"], "output_hashes": ["A", "B"],
             "prefix_hashes": ["A3", "B5"]}
    span = {"mode": "self_cmr", "prompt_hashes": ["a", "b"],
            "output_hashes": ["A3", "Bx"]}
    whole = {"mode": "ngram", "prompt_hashes": ["a"], "output_hashes": ["A"]}
    report.count_mismatches([plain, span, whole])
    assert (span["mismatches"], whole["mismatches"]) == (1, 0)


# --------------------------------------------------------------------------- #
# summary rows from a tiny fake results file
# --------------------------------------------------------------------------- #
def fake_row(mode, outputs, forwards, kept, config=None, mismatched=()):
    """A quote row at 2048 over prompts p0..p3: output lengths and forwards
    per prompt; only p0 was answered whole."""
    hashes = [f"p{i}" for i in range(len(outputs))]
    return {
        "task": "quote", "dataset": "govreport", "length": 2048, "mode": mode,
        "config": config,
        "working_set": 512 if config and config.get("top_k") else None,
        "prompt_hashes": hashes,
        "output_hashes": [f"o{i}" + ("x" if i in mismatched else "") for i in
                          range(len(outputs))],
        "output_lens": outputs, "forwards": forwards, "kept": kept,
        "correct": [i == 0 for i in range(len(outputs))],
    }


def fake_results():
    cmr = {"policy": "cmr", "top_k": 11, "chunk_size": 32, "sink_tokens": 32,
           "recent_tokens": 128}
    window = {**cmr, "policy": "streaming"}
    kept = [True, True, False, True]
    rows = [
        fake_row("none", [101, 101, 101, 101], [100, 100, 100, 100], kept),
        fake_row("self_streaming", [101, 101, 101, 101], [50, 40, 10, 50], kept,
                 window),
        fake_row("self_cmr", [101, 101, 101, 101], [25, 20, 10, 25], kept,
                 {**cmr, "score_layer": 21}),
        fake_row("self_cmr", [101, 101, 101, 101], [50, 40, 10, 25], kept,
                 {**cmr, "score_layer": -1}, mismatched=(2,)),
        fake_row("ngram", [101, 101, 101, 101], [20, 25, 10, 20], kept),
    ]
    meta = {"hardware": {"device": "NVIDIA H100 80GB HBM3"},
            "models": {"target": {"path": "/t"},
                       "draft": {"path": "(self_draft only)"}}}
    return {"r.json": {"meta": meta, "rows": rows}}


def test_summary_rows_keep_only_the_cases_that_count():
    summary = copysummary.summary(fake_results())
    rows = {r["mode"]: r for r in summary["rows"]}
    assert list(rows) == ["plain", "window", "cmr", "cmr_l21", "ngram"]
    for r in rows.values():
        assert set(r) >= {"task", "context", "mode", "accepted_length", "ci",
                          "n_prompts", "mismatches", "device"}
        assert (r["task"], r["context"], r["n_prompts"], r["n_run"]) == ("quote", 2048,
                                                                        3, 4)
        assert (r["n_cases"], r["n_right"]) == (4, 1)
        assert r["device"] == "NVIDIA H100 80GB HBM3"
    # Tokens per target forward over p0, p1, p3 (p2 does not count).
    assert rows["plain"]["accepted_length"] == 1.0
    assert rows["window"]["accepted_length"] == pytest.approx(300 / 140)
    assert rows["cmr_l21"]["accepted_length"] == pytest.approx(300 / 70)
    assert rows["cmr"]["accepted_length"] == pytest.approx(300 / 115)
    assert rows["ngram"]["accepted_length"] == pytest.approx(300 / 65)
    lo, hi = rows["window"]["ci"]
    assert 100 / 50 <= lo <= rows["window"]["accepted_length"] <= hi <= 100 / 40
    assert rows["cmr"]["mismatches"] == 1 and rows["window"]["mismatches"] == 0
    assert rows["window"]["draft"] == "self"
    assert rows["ngram"]["draft"] == "prompt lookup"


def test_summary_pairs_modes_against_the_window_and_ngram():
    pairs = {(p["mode"], p["baseline"]): p
             for p in copysummary.summary(fake_results())["paired"]}
    assert set(pairs) == {("cmr", "window"), ("cmr", "ngram"), ("cmr_l21", "window"),
                          ("cmr_l21", "ngram"), ("ngram", "window")}
    p = pairs[("cmr_l21", "window")]
    assert p["ratio"] == pytest.approx((300 / 70) / (300 / 140))
    assert (p["better"], p["prompts"]) == (3, 3)
    assert pairs[("cmr", "window")]["better"] == 1
    assert pairs[("cmr_l21", "ngram")]["ratio"] < 1


def test_summary_of_a_later_file_replaces_a_repeated_run():
    first = fake_results()["r.json"]
    later = {"meta": first["meta"], "rows": [
        {**first["rows"][1], "forwards": [25, 20, 10, 25]}]}
    summary = copysummary.summary({"a.json": first, "b.json": later})
    window = next(r for r in summary["rows"] if r["mode"] == "window")
    assert window["accepted_length"] == pytest.approx(300 / 70)
    assert "| quote | govreport | 2048 | self | window |" in (
        copysummary.summary_markdown(summary))
