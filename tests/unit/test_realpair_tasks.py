"""The real-pair task set (benchmarks/realpair/tasks.py, corpus.py): prompt
lengths, distinct starts, depths, expected answers, checks and files. CPU and
offline: the tiny models' tokenizer, a few synthetic .py files and synthetic
PG-19 / GovReport rows ($SPECEXTEND_DATA_DIR), small contexts."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import random
import re

import pytest

from benchmarks import prompts
from benchmarks.realpair import corpus, tasks
from benchmarks.realpair.corpus import word_pattern

CONTEXTS = (1024, 2048)
N = 4
WORDS = ("the of and to in a is that for it as was with be by on not he this are "
         "or his from at which but have they were her she there one all their "
         "has been would will other when more said if what about time people "
         "year day man world life hand part child eye woman place work week "
         "house water night story light voice letter money father mother ship "
         "good new first last long great little old right big high small large "
         "made went came took gave found thought told asked seemed felt left").split()
PEOPLE = ("Ashdown", "Pellow", "Marchbank", "Quill", "Tregarth", "Voss")


# --------------------------------------------------------------------------- #
# synthetic sources
# --------------------------------------------------------------------------- #
def _function(rng: random.Random, name: str, indent: str = "",
              first: str = "") -> list[str]:
    acc = rng.choice(("total", "count", "result", "weight")) + f"_{rng.randint(1, 99)}"
    body = [f"def {name}({first}items, limit={rng.randint(2, 9)}):",
            f'    """Walk the {rng.choice(WORDS)} items of the {rng.choice(WORDS)}."""',
            f"    {acc} = {rng.randint(0, 5)}",
            "    seen = []",
            "    for item in items:",
            f"        if {acc} > limit * {rng.randint(2, 7)}:",
            "            break",
            f"        {acc} += len(str(item)) + {rng.randint(1, 9)}",
            "        seen.append(item)",
            f"        note = '{rng.choice(WORDS)} {rng.choice(WORDS)}'",
            "        if note and item in seen:",
            f"            {acc} -= {rng.randint(1, 3)}",
            "    if not seen:",
            "        return None",
            f"    return {acc}, seen"]
    return [indent + line if line else line for line in body]


def _code_file(i: int) -> str:
    rng = random.Random(i)
    out = [f'"""Module {i}: {rng.choice(WORDS)} {rng.choice(WORDS)} helpers."""',
           "", "import os", ""]
    for k in range(3):
        out += ["", *_function(rng, f"walk_{i}_{k}"), ""]
    out += ["", f"class Keeper{i}:", "    def __init__(self):", "        self.x = 1",
            ""]
    out += _function(rng, f"method_{i}", "    ", "self, ")
    if i % 5 == 0:  # excluded: a tab, and a line over 100 characters
        tabbed, wide = _function(rng, f"tabbed_{i}"), _function(rng, f"wide_{i}")
        tabbed.insert(-1, "    pass\t# a tab")
        wide.insert(-1, "    # " + "w" * 110)
        out += ["", *tabbed, "", *wide]
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def code_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("code")
    for i in range(40):
        folder = root / f"pkg{i // 10}"
        folder.mkdir(exist_ok=True)
        (folder / f"mod_{i:02d}.py").write_text(_code_file(i))
    (root / "tests").mkdir()
    (root / "tests" / "test_x.py").write_text(_code_file(99))
    (root / "broken.py").write_text("def broken(:\n    pass\n")
    return root


def _sentence(rng: random.Random, name: str | None = None) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(8, 14))]
    if name:
        words.insert(rng.randint(2, len(words) - 1), name)
    return words[0].capitalize() + " " + " ".join(words[1:]) + "."


def _book(i: int) -> str:
    rng = random.Random(1000 + i)
    paras = []
    for _ in range(14):
        name = rng.choice(PEOPLE)
        text = " ".join(_sentence(rng, name if k % 2 else None)
                        for k in range(rng.randint(4, 7)))
        # PG-19's hard line breaks
        paras.append(re.sub(r"(.{60,70}) ", "\\1\n", text))
    return "\n\n".join(paras)


def _report(i: int) -> tuple[str, str]:
    rng = random.Random(2000 + i)
    size = rng.randint(12, 40)
    text = " ".join(_sentence(rng, rng.choice(PEOPLE)) for _ in range(size))
    return text, " ".join(_sentence(rng) for _ in range(4))


def _row(text: str, **extra) -> str:
    head = "\n\nSummarize the following text.\n### Text:\n\n"
    return json.dumps({"text": f"{head}<s> {text}\n\n### Summary:\n\n", **extra})


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    (root / "pg19").mkdir()
    (root / "govreport").mkdir()
    (root / "pg19" / "pg19_8K.jsonl").write_text(
        "\n".join(_row(_book(i)) for i in range(30)) + "\n")
    rows = [_row(text, answer=answer) for text, answer in map(_report, range(40))]
    (root / "govreport" / "govreport_8K.jsonl").write_text("\n".join(rows) + "\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECEXTEND_DATA_DIR", str(root))
        prompts.load_texts.cache_clear()
        yield root
    prompts.load_texts.cache_clear()


@pytest.fixture(scope="module")
def built(tiny_tokenizer, code_dir, data_dir):
    return tasks.build_cases(tiny_tokenizer, contexts=CONTEXTS, n=N, code_dir=code_dir)


def _common(a: list[int], b: list[int]) -> int:
    pairs = enumerate(zip(a, b, strict=False))
    return next((i for i, (x, y) in pairs if x != y), min(len(a), len(b)))


# --------------------------------------------------------------------------- #
# the set
# --------------------------------------------------------------------------- #
def test_cells_kinds_and_lengths(built):
    assert len(built) == len(CONTEXTS) * 2 * N
    assert len({c.id for c in built}) == len(built)
    for context, group in itertools.product(CONTEXTS, tasks.GROUPS):
        cell = [c for c in built if c.context == context and c.group == group]
        kinds = tasks.GROUPS[group]
        assert [c.kind for c in cell] == [kinds[i % len(kinds)] for i in range(N)]
        assert cell[1].id == f"{group}-{context}-01-{kinds[1]}"
    for case in built:
        assert len(case.prompt_ids) == case.prompt_tokens
        assert 0.97 * case.context <= case.prompt_tokens <= case.context, case.id


def test_every_prompt_starts_differently(built, tiny_tokenizer):
    # past the chat template's first tokens and "# File: pkg" or "[Book]\n\n"
    for a, b in itertools.combinations(built, 2):
        assert _common(a.prompt_ids, b.prompt_ids) < 24, (a.id, b.id)
    assert len({c.meta["first"] for c in built}) == len(built)


def test_depths_and_max_tokens(built, tiny_tokenizer):
    for case in built:
        if case.kind == "summarize_report":
            assert case.meta["depth"] > 0.1 and case.max_tokens == 384
            continue
        assert 0.1 <= case.meta["depth"] <= 0.6, case.id
        if case.kind == "explain_code":
            assert case.max_tokens == 256 and case.expected is None
        else:
            ids = tiny_tokenizer(case.expected, add_special_tokens=False)["input_ids"]
            n = len(ids)
            assert case.max_tokens == min(512, n + 64)
    # depths of one kind spread over the cell
    quotes = [c.meta["depth"] for c in built if c.kind == "explain_code"]
    assert max(quotes) - min(quotes) > 0.1


def test_copy_answers_come_from_the_prompt(built, tiny_tokenizer, code_dir):
    for case in built:
        text = tiny_tokenizer.decode(case.prompt_ids)
        if case.kind in ("quote_code", "quote_prose"):
            assert text.count(case.expected) == 1, case.id
        if case.kind in ("quote_code", "rename_code", "explain_code"):
            name = case.meta["function"]
            assert len(re.findall(rf"def {name}\(", text)) == 1
            assert f"`{name}`" in text
            assert not name.startswith(("tabbed", "wide"))
        if case.kind == "rename_code":
            old, new = case.meta["old"], case.meta["new"]
            f = corpus.code_file(str(code_dir), case.meta["file"])
            fn = next(g for g in f.functions if g.qualname == case.meta["qualname"])
            assert case.expected != fn.source and fn.source in text
            assert not re.search(word_pattern(old), case.expected)
            assert not re.search(word_pattern(new), fn.source)
            assert case.expected.replace(new, old) == fn.source
            assert old != "self"
        if case.kind == "edit_prose":
            old, new = case.meta["old"], case.meta["new"]
            assert text.count(new) == 1  # the instruction's only
            assert case.expected.count(new) >= 2
            original = re.sub(word_pattern(new), old, case.expected)
            assert text.count(original) == 1
            assert f'every "{old}" replaced by "{new}"' in text
        if case.kind == "summarize_report":
            assert case.expected  # the reference summary
            assert text.rstrip().endswith("assistant")  # the chat template's turn
            assert f'begins "{case.meta["opening"]}"' in text


def test_build_is_deterministic_and_seeded(built, tiny_tokenizer, code_dir, data_dir):
    again = tasks.build_cases(tiny_tokenizer, contexts=CONTEXTS, n=N, code_dir=code_dir)
    assert tasks.cases_sha256(again) == tasks.cases_sha256(built)
    other = tasks.build_cases(tiny_tokenizer, contexts=CONTEXTS[:1], groups=("copy",),
                              n=N, code_dir=code_dir, seed=1)
    assert other[0].prompt_ids != built[0].prompt_ids


def test_plain_layout_without_a_chat_template(tiny_tokenizer, code_dir, data_dir):
    plain = copy.deepcopy(tiny_tokenizer)
    plain.chat_template = None
    cases = tasks.build_cases(plain, contexts=(1024,), groups=("copy",), n=N,
                              code_dir=code_dir)
    for case in cases:
        text = plain.decode(case.prompt_ids)
        assert text.startswith("### Text:\n\n") and text.endswith("### Answer:\n")
        assert 0.97 * 1024 <= case.prompt_tokens <= 1024


# --------------------------------------------------------------------------- #
# checks
# --------------------------------------------------------------------------- #
def _one_token_changed(tokenizer, text: str) -> str:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    i = next(k for k in range(len(ids) // 2, len(ids))
             if tokenizer.decode(ids[k:k + 1]).strip().isalpha())
    swap = tokenizer("Q", add_special_tokens=False)["input_ids"]
    return tokenizer.decode(ids[:i] + swap + ids[i + 1:])


def test_check_copy_kinds(built, tiny_tokenizer):
    for case in built:
        if case.expected is None or case.kind == "summarize_report":
            continue
        assert tasks.check(case, f"Here it is:\n```python\n{case.expected}\n```\nDone.")
        assert tasks.check(case, case.expected + "\n\n")  # no fence: the whole answer
        wrong = _one_token_changed(tiny_tokenizer, case.expected)
        assert wrong != case.expected
        assert tasks.check(case, f"```python\n{wrong}\n```") is False, case.id
    prose = next(c for c in built if c.kind == "quote_prose")
    assert tasks.check(prose, " ".join(prose.expected.split()))  # reflowed
    code = next(c for c in built if c.kind == "quote_code")
    assert tasks.check(code, "```python\n" + code.expected)  # unclosed fence
    method = dataclasses.replace(code, expected="\n".join(
        "    " + line if line else line for line in code.expected.split("\n")))
    assert tasks.check(method, f"```\n{code.expected}\n```")  # at column 0


def test_check_explain_and_summary(built):
    explain = next(c for c in built if c.kind == "explain_code")
    name = explain.meta["function"]
    assert tasks.check(explain, f"`{name}` counts the items' lengths.") is True
    assert tasks.check(explain, "  ") is False
    assert tasks.check(explain, "It counts things.") is False
    summary = next(c for c in built if c.kind == "summarize_report")
    assert tasks.check(summary, summary.expected) is True
    assert tasks.check(summary, "Nothing to see here at all, really.") is False
    assert tasks.check(dataclasses.replace(summary, expected=None), "x") is None
    assert tasks.fenced("a\n```py\nx = 1\n```\n```\ny\n```") == "x = 1\n"


# --------------------------------------------------------------------------- #
# files, corpus
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("name", ["cases.jsonl", "cases.jsonl.gz"])
def test_save_load_round_trip(built, tiny_tokenizer, tmp_path, name):
    path = tmp_path / name
    header = tasks.save_cases(built, path, tiny_tokenizer, seed=0)
    assert header["vocab_size"] == len(tiny_tokenizer)
    assert header["sha256"] == tasks.cases_sha256(built)
    loaded_header, loaded = tasks.load_cases(path)
    assert loaded == built and loaded_header == header
    assert tasks.cases_sha256(loaded) == header["sha256"]
    if name.endswith(".jsonl"):
        lines = path.read_text().splitlines()
        row = json.loads(lines[1])
        row["max_tokens"] += 1
        path.write_text("\n".join([lines[0], json.dumps(row), *lines[2:]]) + "\n")
        with pytest.raises(ValueError, match="sha256"):
            tasks.load_cases(path)
    rows = tasks.table(built)
    assert len(rows) == 1 + len(CONTEXTS) * 2 and rows[1].startswith("copy-1024")


def test_code_corpus(code_dir):
    paths = corpus.code_paths(str(code_dir))
    assert "broken.py" in paths and not any(p.startswith("tests/") for p in paths)
    assert corpus.code_file(str(code_dir), "broken.py") is None
    f = corpus.code_file(str(code_dir), "pkg0/mod_00.py")
    names = [fn.qualname for fn in f.functions]
    assert names == ["walk_0_0", "walk_0_1", "walk_0_2", "Keeper0.method_0"]
    method = f.functions[-1]
    assert method.source.startswith("    def method_0(self, items")
    assert f.text[method.offset:].startswith(method.source)
    assert "seen" in method.locals and "self" not in method.locals
    assert "note" not in method.locals  # used twice only


def test_renamable_leaves_out_attributes_and_keywords(tmp_path):
    (tmp_path / "m.py").write_text(
        "def f(self, value, other):\n"
        "    value = value + 1\n"
        "    other.value = value\n"  # an attribute named value: not a clean rename
        "    result = g(other=other)\n"  # a keyword named other
        "    result = result + len(result)\n"
        "    return result\n" + "    pass\n" * 8)
    fn = corpus.code_file(str(tmp_path), "m.py").functions[0]
    assert fn.locals == ("result",) and fn.params == ("self", "value", "other")


def test_summary_puts_books_first_when_reports_run_out(tiny_tokenizer, code_dir,
                                                       data_dir, tmp_path,
                                                       monkeypatch):
    (tmp_path / "pg19").mkdir()
    (tmp_path / "govreport").mkdir()
    (tmp_path / "pg19" / "pg19_8K.jsonl").write_text(
        (data_dir / "pg19" / "pg19_8K.jsonl").read_text())
    rows = [_row(text, answer=answer) for text, answer in map(_report, (3, 7))]
    (tmp_path / "govreport" / "govreport_8K.jsonl").write_text("\n".join(rows) + "\n")
    monkeypatch.setenv("SPECEXTEND_DATA_DIR", str(tmp_path))
    prompts.load_texts.cache_clear()
    try:
        cases = tasks.build_cases(tiny_tokenizer, contexts=(2048,), groups=("other",),
                                  n=4, code_dir=code_dir)
    finally:
        prompts.load_texts.cache_clear()
    for case in cases[1::2]:
        text = tiny_tokenizer.decode(case.prompt_ids)
        assert case.meta["first"].startswith("pg19:")
        assert text.index("[Book]") < text.index("[Report]")
        assert 0.97 * 2048 <= case.prompt_tokens <= 2048
        assert tasks.check(case, case.expected)
