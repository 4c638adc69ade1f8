# host_run.sh gpu-tests: the plugin's GPU tests: step shapes, host syncs,
# lossless under CUDA graphs.
# Feeds: results/gpu_tests/*_gpu-tests.txt, *_self-draft-gpu.txt
#
# The plugin's GPU checks: vLLM's spec-decode kernels compiled once for
# every step shape, the input copy once a block at warm-up (first: before
# any engine runs them), the step without host syncs (a pooled prompt's
# step too), self_draft lossless under CUDA graphs, the same chunks with
# graphs as eagerly, the kernels.
timeout ${GPU_TESTS_TIMEOUT:-300} python3 -m pytest -v -p no:cacheprovider \
  tests/kernels/test_step_shape_gpu.py \
  tests/unit/test_proposer_step.py tests/unit/test_pool_parts.py \
  tests/kernels/test_self_draft_gpu.py \
  tests/kernels/test_capture_gpu.py tests/kernels/test_scoring_triton.py \
  > "$OUT/gpu_tests.txt" 2>&1
echo "gpu-tests rc=$?"; grep -E "PASSED|FAILED|ERROR|passed|failed" "$OUT/gpu_tests.txt" \
  | grep -v test_scoring_triton | tail -30
