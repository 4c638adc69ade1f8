"""benchmarks/longinput/vocab_coverage.py: the share of a text's tokens below a cut."""

from __future__ import annotations

import numpy as np

from benchmarks.longinput import vocab_coverage


def test_coverage_counts_ids_below_each_cut():
    ids = np.array([0, 1, 5, 9, 10, 99, 100, 4000])
    assert vocab_coverage.coverage(ids, [1, 10, 100, 5000]) == {
        1: 1 / 8, 10: 4 / 8, 100: 6 / 8, 5000: 1.0}


def test_dataset_ids_concatenate_every_document(monkeypatch):
    monkeypatch.setattr(vocab_coverage.text_data, "load_texts",
                        lambda dataset: ("ab", "abc"))

    def tokenizer(texts, add_special_tokens):
        assert add_special_tokens is False
        return {"input_ids": [[ord(c) for c in t] for t in texts]}

    ids = vocab_coverage.dataset_ids(tokenizer, "pg19")
    assert ids.tolist() == [97, 98, 97, 98, 99]


def test_markdown_has_a_column_per_cut():
    result = {"cuts": [10, 20], "rows": [
        {"tokenizer": "t", "vocab_size": 30, "dataset": "pg19", "tokens": 4,
         "coverage": {"10": 0.5, "20": 0.75}}]}
    text = vocab_coverage.markdown(result)
    assert "| < 10 | < 20 |" in text
    assert "| t | 30 | pg19 | 4 | 50.0% | 75.0% |" in text
