"""The result files' commit: the packed tree's on a GPU host, else HEAD."""

import subprocess

from benchmarks.harness.meta import REPO_ROOT, git_commit


def test_the_packed_trees_commit_comes_first(monkeypatch):
    monkeypatch.setenv("SPECEXTEND_COMMIT", "0123abc-dirty")
    assert git_commit() == "0123abc-dirty"


def test_without_a_pack_the_commit_is_head(monkeypatch):
    monkeypatch.delenv("SPECEXTEND_COMMIT", raising=False)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT,
                          capture_output=True, text=True).stdout.strip()
    assert git_commit() == (head or None)
