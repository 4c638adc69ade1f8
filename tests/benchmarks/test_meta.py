"""The result files' commit: the packed tree's on a GPU host, else HEAD."""

import subprocess

from benchmarks.harness.meta import REPO_ROOT, git_commit


def test_the_packed_trees_commit_comes_first(monkeypatch):
    monkeypatch.setenv("SPECEXTEND_COMMIT", "0123abc-dirty")
    assert git_commit() == "0123abc-dirty"


def _git(root, *args) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_without_a_pack_the_commit_is_head_and_says_an_edit(monkeypatch, tmp_path):
    """Where the plugin's or the benches' code differs from HEAD the commit
    says ``-dirty``, as prepare.sh's does; a new result file does not."""
    from benchmarks.harness import meta

    monkeypatch.delenv("SPECEXTEND_COMMIT", raising=False)
    monkeypatch.setattr(meta, "REPO_ROOT", tmp_path)
    _git(tmp_path, "init", "-q")
    for part in ("vllm_specextend/a.py", "benchmarks/b.py"):
        (tmp_path / part).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / part).write_text(part)
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    head = _git(tmp_path, "rev-parse", "HEAD")
    assert git_commit() == head
    (tmp_path / "benchmarks/results").mkdir()
    (tmp_path / "benchmarks/results/r.json").write_text("{}")
    assert git_commit() == head
    (tmp_path / "vllm_specextend/a.py").write_text("edited")
    assert git_commit() == f"{head}-dirty"
    _git(tmp_path, "checkout", "-q", "--", "vllm_specextend/a.py")
    (tmp_path / "benchmarks/new.py").write_text("")  # untracked code
    assert git_commit() == f"{head}-dirty"


def _tree_hash(root) -> str:
    return subprocess.run(
        ["bash", "-c", f"source {REPO_ROOT}/benchmarks/gpu/tree.sh && tree_hash"],
        cwd=root, capture_output=True, text=True, check=True).stdout.strip()


def test_the_tree_hash_follows_the_code_not_the_results(tmp_path):
    """host_run.sh marks a result ``-stale`` where the carried code's hash is
    not the packed tree's: an edit to the code changes it, a result file
    does not."""
    for part in ("vllm_specextend/a.py", "benchmarks/gpu/b.sh",
                 "benchmarks/results/r.json"):
        (tmp_path / part).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / part).write_text(part)
    packed = _tree_hash(tmp_path)
    assert len(packed) == 12
    (tmp_path / "benchmarks/results/r.json").write_text("{}")
    (tmp_path / "benchmarks/results/s.py").write_text("")
    assert _tree_hash(tmp_path) == packed
    (tmp_path / "vllm_specextend/a.py").write_text("edited")
    assert _tree_hash(tmp_path) != packed
