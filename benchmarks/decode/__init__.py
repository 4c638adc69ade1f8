"""Decode speed: ``bench_decode`` times plain decoding, vLLM's speculation and
SpecExtend through ``LLM.generate`` (one engine per mode), ``summarize_decode``
prints a result file's table and ``plot_decode`` draws tok/s against context;
``bench_compaction`` and ``bench_scoring`` time two parts of a SpecExtend step
on their own (a compaction's copy and rotation, the Triton scoring kernel).
Entry points, from the repository root::

    python -m benchmarks.decode.bench_decode --target-config T --draft-config D \\
        --out R.json
    python -m benchmarks.decode.summarize_decode R.json
    python -m benchmarks.decode.plot_decode R.json [R2.json ...] --out decode.png
    python -m benchmarks.decode.bench_compaction --out C.json
    python -m benchmarks.decode.bench_scoring --ctx 4096 32768 --batch 1 8 --out S.json
"""
