# host_run.sh capture: the captured draft routine's test
# (tests/kernels/test_capture_gpu.py) alone.
# Feeds: results/scoring/*_capture-test.txt, results/gpu_tests/*capture*.txt
timeout 500 python3 -m pytest tests/kernels/test_capture_gpu.py -q -x -p no:cacheprovider \
  > "$OUT/capture.txt" 2>&1; grep -E "passed|failed|Error|assert" "$OUT/capture.txt" | tail -8
