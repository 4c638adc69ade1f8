"""Models for tests, benchmarks and the demo: offline builders (``builders``),
the distilled SmolLM2 draft pair (``build_pair``, ``distill``,
``pydoc_corpus``) and the configs of the benchmarked shapes (``configs/``)."""
