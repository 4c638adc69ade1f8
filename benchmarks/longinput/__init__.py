"""Long-input evaluation of SpecExtend with real models: ``eval_longinput``
runs vLLM in-process over the paper's inputs (GovReport / PG-19 summaries,
the passkey needle, CMR sweeps and costs, the copy tasks) and ``plot_eval``
draws its results; ``score_layers`` probes which of a target's attention
layers would retrieve a passkey's chunk (CPU, transformers) and
``vocab_coverage`` measures the share of the documents' tokens a draft
vocabulary cut keeps (CPU, tokenizer only). Their parts: ``inputs``,
``needle``, ``copytasks`` (and their ``copysummary``), ``engine``,
``acceptance`` and ``report``. Entry points, from the repository root::

    python -m benchmarks.longinput.eval_longinput run --target T --draft D --out R.json
    python -m benchmarks.longinput.plot_eval R.json [R2.json ...] --out-dir DIR
    python -m benchmarks.longinput.score_layers --model M --length 4096 --out R.json
    python -m benchmarks.longinput.vocab_coverage --tokenizer DIR --cuts N --out R.json
"""
