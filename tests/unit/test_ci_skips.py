"""CI's skip check (.ci/skips.py): only a missing GPU may skip a test."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "skips.py"


def _skips():
    spec = importlib.util.spec_from_file_location("ci_skips", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _junit(tmp_path, *reasons):
    cases = "".join(
        f'<testcase classname="tests.x" name="t{i}"><skipped message="{r}"/></testcase>'
        for i, r in enumerate(reasons))
    path = tmp_path / "junit.xml"
    path.write_text(f'<testsuites><testsuite name="pytest">{cases}'
                    '<testcase classname="tests.x" name="ran"/></testsuite></testsuites>')
    return str(path)


def test_gpu_skips_pass(tmp_path):
    skips = _skips()
    path = _junit(tmp_path, "needs a CUDA GPU", "Triton kernel needs CUDA", "needs 2 GPUs")
    assert skips.unexpected(path) == []
    # A module-level skip, as pytest writes it (CI run of 2026-12-06).
    module = tmp_path / "module.xml"
    module.write_text(
        '<testsuites><testsuite><testcase classname="" name="tests.kernels.test_tp_gpu">'
        '<skipped message="collection skipped">tests/kernels/test_tp_gpu.py:28: '
        "needs CUDA GPUs</skipped></testcase></testsuite></testsuites>")
    assert skips.unexpected(str(module)) == []
    assert skips.main(["skips.py", path]) == 0


def test_missing_data_fails(tmp_path, capsys):
    skips = _skips()
    path = _junit(tmp_path, "needs CUDA",
                  "long-context data not found under ../shared/data")
    assert skips.main(["skips.py", path]) == 1
    out = capsys.readouterr().out
    assert "tests.x::t1: long-context data not found" in out
    assert "1 tests skipped" in out


def test_a_gpu_path_does_not_excuse_a_skip(tmp_path):
    skips = _skips()
    path = tmp_path / "j.xml"
    path.write_text(
        '<testsuites><testsuite>'
        '<testcase classname="" name="tests.kernels.test_x_gpu">'
        "<skipped message=\"collection skipped\">('/work/tests/kernels/test_x_gpu.py', 9, "
        "'Skipped: could not import kubernetes_validate')</skipped></testcase>"
        '<testcase classname="tests.x" name="xf"><skipped type="pytest.xfail" message="later"/>'
        "</testcase></testsuite></testsuites>")
    assert [r for _, r in skips.unexpected(str(path))] == [
        "could not import kubernetes_validate"]
