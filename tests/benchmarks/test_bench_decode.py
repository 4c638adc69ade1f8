"""``python -m benchmarks.bench_decode --method eagle3`` end to end on CPU (fp32, real
rejection sampling): the tiny target with the 256-position EAGLE-3 head on a
1024-token prompt, vLLM alone and with SpecExtend (one engine process each).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

REPO_ROOT = Path(__file__).resolve().parents[2]
# Fits the head's 256 positions with K=3 (working set 206).
SPEC_EXTEND = json.dumps({"top_k": 2, "recent_tokens": 64, "retrieve_every": 2,
                          "min_context": 256})


def test_eagle3_rows(tiny_target, tiny_short_eagle3, tmp_path):
    out = tmp_path / "decode.json"
    cmd = [sys.executable, "-m", "benchmarks.bench_decode", "--target-config", tiny_target,
           "--draft-config", tiny_short_eagle3, "--method", "eagle3",
           "--modes", "draft_model", "spec_extend", "--spec-extend", SPEC_EXTEND,
           "--load-format", "auto", "--dtype", "float32", "--acceptance-length", "0",
           "--enforce-eager", "--kv-cache-memory-bytes", "1000000000",
           "--block-size", "32", "--contexts", "1024", "--batch-sizes", "1",
           "--output-len", "16", "--num-spec-tokens", "3", "--out", str(out)]
    env = {**os.environ, "PYTHONPYCACHEPREFIX":
           os.environ.get("PYTHONPYCACHEPREFIX", "/tmp/pycache")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env,
                          stdin=subprocess.DEVNULL, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(out.read_text())
    alone, extend = result["results"]

    assert result["meta"]["config"]["method"] == "eagle3"
    assert (alone["mode"], extend["mode"]) == ("eagle3", "spec_extend")
    assert alone["method"] == extend["method"] == "eagle3"
    assert alone["output_sha256"] == extend["output_sha256"]  # both lossless
    # Past the head's positions vLLM alone never runs it: its token-0
    # placeholders are verified and rejected.
    assert alone["draft_steps"] == 0 and alone["acceptance_length"] == 1.0
    # SpecExtend drafts, through compacted views.
    assert extend["draft_steps"] > 0 and extend["spec_extend"]["view_rows"] > 0
    assert extend["spec_extend"]["compactions"] > 0
