"""Long-input evaluation of SpecExtend: inputs, engine runs, scoring, reports.

Used by ``benchmarks.eval_longinput`` and ``benchmarks.plot_eval``.
"""
