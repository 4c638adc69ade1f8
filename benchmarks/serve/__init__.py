"""Serving under load: ``bench_serve`` load-tests one ``vllm serve`` per mode
with ``vllm bench serve`` (bursts or request rates, several workloads) and
writes its tables, ``plot_serve`` draws a result's (or the README summary's)
decode tok/s and TPOT, ``serve_timeline`` recomputes where each run's decode
window went from the per-request records, and ``soak`` keeps a SpecExtend
server under a long, mixed and hostile load and checks that nothing took it
down; ``series`` names and orders a result's rows for both the tables and the
plots; ``bench_client`` runs bench_serve's ``vllm bench serve`` runs in one
warm process. Entry points, from the repository root::

    python -m benchmarks.serve.bench_serve --target T --draft D --out-dir DIR -- ...
    python -m benchmarks.serve.plot_serve DIR/results.json [--out-dir DIR]
    python -m benchmarks.serve.serve_timeline OUT.json DIR [DIR ...]
    python -m benchmarks.serve.soak --target T --draft D --tokenizer TOK -- ...
"""
