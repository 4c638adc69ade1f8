"""Benchmarks, the long-input evaluation and the test and demo models of
vllm-specextend. Not part of the wheel: run its tools as modules from the
repository root, e.g. ``python -m benchmarks.decode.bench_decode --help``.

* ``decode``: decode speed (``bench_decode``), its tables and plots, and the
  costs of a compaction and of the scoring kernel;
* ``serve``: serving under load (``bench_serve``), its plots and timelines,
  and the soak;
* ``harness``: what the benchmarks share (server launcher, proposer accessors,
  run metadata, modes, measures);
* ``prompts``: long prompts of exact token lengths from ``../shared/data``;
* ``models``: offline model builders and the distilled draft pair;
* ``longinput``: the long-input evaluation (``eval_longinput``), its plots, and
  the scoring-layer and vocabulary-cut probes.
"""
