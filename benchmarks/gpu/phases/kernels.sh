# host_run.sh kernels: the plugin's kernel tests, then the scoring kernel's
# cost (bench_scoring).
# Feeds: results/scoring/ (*_kernel-tests.txt, *.json)
#
# The deferral file needs a process of its own (graph-tests runs it).
timeout 200 python3 -m pytest tests/kernels -q -p no:cacheprovider \
  --ignore=tests/kernels/test_prefill_deferral_gpu.py \
  > "$OUT/kernels.txt" 2>&1; tail -3 "$OUT/kernels.txt"
timeout 120 python3 -m benchmarks.decode.bench_scoring --out "$OUT/scoring.json" \
  > "$OUT/scoring.log" 2>&1; tail -20 "$OUT/scoring.log"
