# host_run.sh tp-tests: the captured draft routine at TP=2 and TP=4
# (tests/kernels/test_tp_gpu.py).
# Feeds: issue #44; results/gpu_tests/*_tp-*-tests.txt
#
# Issue #44: the captured draft routine at TP=2 and TP=4 against vLLM's
# own speculation (tests/kernels/test_tp_gpu.py); TP_TESTS_K selects (-k).
export VLLM_ALLREDUCE_USE_SYMM_MEM=0
timeout ${GPU_TESTS_TIMEOUT:-400} python3 -m pytest -v -p no:cacheprovider \
  ${TP_TESTS_K:+-k "$TP_TESTS_K"} tests/kernels/test_tp_gpu.py > "$OUT/tp_tests.txt" 2>&1
echo "tp-tests rc=$?"; grep -E "PASSED|FAILED|ERROR|passed|failed|Error|assert" \
  "$OUT/tp_tests.txt" | tail -20
