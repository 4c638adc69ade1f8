"""SpecExtend's workers, one module per platform (``gpu``, ``cpu``), so that a
platform never imports the other platform's vLLM worker module.

``--spec-extend`` selects the platform's class itself
(``compat.PLATFORM_WORKERS``). The earlier qualnames
``vllm_specextend.worker.GPUWorker`` / ``.CPUWorker`` still resolve: vLLM
looks the class up by qualname, and this package imports the platform module
only when one of them is asked for.
"""

from __future__ import annotations

import importlib

_MODULES = {"GPUWorker": "gpu", "CPUWorker": "cpu"}


def __getattr__(name: str):
    if name not in _MODULES:
        raise AttributeError(name)
    module = importlib.import_module(f"{__name__}.{_MODULES[name]}")
    return getattr(module, name)
