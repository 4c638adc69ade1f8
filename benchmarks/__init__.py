"""Benchmarks, the long-input evaluation and the test and demo models of
vllm-specextend, grouped by job. Not part of the wheel: run its tools as
modules from the repository root, e.g.
``python -m benchmarks.decode.bench_decode --help``.

* ``decode``: decode speed (``bench_decode``), its tables and plots, and the
  costs of a compaction and of the scoring kernel;
* ``serve``: serving under load (``bench_serve``), its plots and timelines,
  and the soak;
* ``longinput``: the long-input evaluation (``eval_longinput``), its parts and
  plots, and the scoring-layer and vocabulary-cut probes;
* ``harness``: what the benchmarks share (server launcher, proposer accessors,
  run metadata, modes, measures);
* ``models``: offline model builders and the distilled draft pair;
* ``gpu``: the GPU host's phases (``host_run.sh PHASE`` runs ``phases/PHASE.sh``)
  and GPU-only probes.

At the top, what serves every job: ``summarize`` (``results/summary.json`` and
the README tables, from the result files of every job), ``merge_results`` (one
result from several device calls' files, decode or serve) and ``prompts``
(long prompts of exact token lengths from ``../shared/data``, for the
benchmarks, the tests and the demo).
"""
