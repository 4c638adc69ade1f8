"""What the benchmarks share, one module per job: ``server`` (start, stop and
read ``vllm serve``), ``drafter`` (every access to the SpecExtend proposer's
internals), ``meta`` (the run metadata block), ``modes`` (how each compared
engine differs from plain decoding) and ``measure`` (the figures both speed
benchmarks compute)."""
