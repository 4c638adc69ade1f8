"""benchmarks/models: training text, distillation helpers, and build_pair.py at
tiny scale (a 4-layer random teacher on CPU, a few steps)."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.models import build_pair, distill, pydoc_corpus
from benchmarks.models.builders import build_tiny_llama

LONG = "x" * 250


def test_stdlib_docstrings_reads_sources_without_importing(tmp_path):
    (tmp_path / "mod.py").write_text(
        f'"""{LONG}"""\nraise SystemExit("imported")\n'
        f'class A:\n    """short"""\n    def f(self):\n        """{LONG}f"""\n'
    )
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "test_mod.py").write_text(f'"""{LONG}t"""\n')
    (tmp_path / "broken.py").write_text(f'"""{LONG}b"""\ndef (:\n')
    assert pydoc_corpus.stdlib_docstrings(200, tmp_path) == [LONG, LONG + "f"]


def test_python_docs_are_available_offline():
    topics = pydoc_corpus.pydoc_topics()
    assert len(topics) > 50 and all(isinstance(t, str) and t for t in topics)


def test_doc_windows_join_documents_with_eos():
    windows = distill.doc_windows([[1, 2, 3], [4, 5]], 3, eos_id=0)
    assert windows == [[1, 2, 3], [0, 4, 5]]  # the trailing [0] is dropped


def test_excerpt_prompts_are_wrapped_excerpts_of_one_document():
    import random

    docs = [list(range(100, 400)), list(range(1000, 1010))]
    templates = [([], []), ([1], [2, 3])]
    prompts = distill.excerpt_prompts(docs, templates, 4, random.Random(0),
                                      min_len=64, max_len=128)
    assert prompts[1][0] == 1 and prompts[1][-2:] == [2, 3]
    for p in prompts:
        body = [t for t in p if t >= 100]
        assert 64 <= len(body) <= 128
        assert body == list(range(body[0], body[0] + len(body)))  # contiguous


def test_pad_batch_and_kd_loss():
    ids, mask = distill.pad_batch([[5, 6, 7], [8]], 4, pad_id=0)
    assert ids.tolist() == [[5, 6, 7, 0], [8, 0, 0, 0]]
    assert mask.sum() == 4
    logits = torch.randn(2, 4, 11)
    assert distill.kd_loss(logits, logits, mask) == pytest.approx(0.0, abs=1e-6)
    other = logits.clone()
    other[~mask] = 100.0  # padding never counts
    assert distill.kd_loss(other, logits, mask) == pytest.approx(0.0, abs=1e-6)
    assert distill.kd_loss(torch.zeros_like(logits), logits, mask) > 0


def test_lr_schedule_warms_up_then_decays_to_a_tenth():
    factors = [distill.lr_at(s, 100, 10) for s in range(100)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert factors[10] == pytest.approx(1.0)
    assert factors[-1] == pytest.approx(0.1, abs=1e-3)
    assert all(a >= b for a, b in zip(factors[10:], factors[11:], strict=False))


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("teacher") / "m", seed=5,
                            num_layers=4)


def test_build_pair_distils_and_reassembles(teacher, tmp_path, monkeypatch):
    monkeypatch.setattr(build_pair.pydoc_corpus, "python_docs",
                        lambda: pydoc_corpus.pydoc_topics()[:30])
    out = tmp_path / "pair"
    common = ["--target", str(teacher), "--device", "cpu"]
    assert build_pair.main([str(out), *common, "--steps", "8", "--batch-size", "4",
                            "--seq-len", "128", "--gen-prompts", "4",
                            "--gen-batch-size", "4", "--warmup", "2",
                            "--save-dtype", "float32"]) == 0

    config = json.loads((out / "draft" / "config.json").read_text())
    assert config["num_hidden_layers"] == 2
    assert config["max_position_embeddings"] == 4096
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["layers"] == [0, 3]
    assert recipe["train"]["steps_done"] == 8
    assert recipe["eval_after"]["kl"] < recipe["eval_before"]["kl"]

    teacher_t = distill.load_tensors(teacher)
    draft_t = distill.load_tensors(out / "draft")
    trained = distill.load_tensors(out)  # draft_trained.safetensors only
    assert set(trained) == {k for k in draft_t if k.startswith("model.layers.")}
    assert {k.split(".")[2] for k in trained} == {"0", "1"}
    for key, value in teacher_t.items():
        if not key.startswith("model.layers."):
            assert torch.equal(draft_t[key], value), f"{key} must stay frozen"
    norm = "model.layers.1.post_attention_layernorm.weight"
    assert torch.equal(draft_t[norm], trained[norm])
    # Layer 1 of the draft started as layer 3 of the teacher and has trained.
    started = teacher_t["model.layers.3.mlp.down_proj.weight"]
    assert not torch.equal(draft_t["model.layers.1.mlp.down_proj.weight"], started)

    again = tmp_path / "again"
    assert build_pair.main([str(again), *common, "--from-trained",
                            str(out / build_pair.TRAINED_FILE)]) == 0
    assert (again / "draft" / "model.safetensors").read_bytes() == (
        out / "draft" / "model.safetensors").read_bytes()
    assert (again / "draft" / "config.json").read_text() == (
        out / "draft" / "config.json").read_text()

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out / "draft")
    assert model.config.num_hidden_layers == 2
