# host_run.sh graph-tests: the captured draft routine's GPU tests, and
# prefill deferral's.
# Feeds: issue #26; results/gpu_tests/*graph-tests*.txt, *deferral*.txt
#
# Issue #26's GPU checks: the captured draft routine drafts what vLLM's
# piecewise path drafts (async scheduling on), and the plugin's step makes
# no host-device sync; kept prompt-chunk passes draft as in their step.
# GRAPH_TESTS: run only these. The deferral file turns vLLM's
# batch-invariant mode on for its process: a pytest process of its own
# (~95 s a case on an H200), after the others; GPU_TESTS_TIMEOUT bounds each.
deferral=tests/kernels/test_prefill_deferral_gpu.py
# Unquoted: one space between the files, newlines included.
files=" $(echo ${GRAPH_TESTS:-tests/kernels/test_draft_graph_gpu.py
  tests/unit/test_proposer_step.py tests/kernels/test_argmax_triton.py $deferral}) "
rest=${files/ $deferral / }
rc=0; : > "$OUT/graph_tests.txt"
if [ -n "${rest// /}" ]; then
  timeout ${GPU_TESTS_TIMEOUT:-400} python3 -m pytest -v -p no:cacheprovider $rest \
    >> "$OUT/graph_tests.txt" 2>&1 || rc=$?
fi
case "$files" in *" $deferral "*)
  timeout ${GPU_TESTS_TIMEOUT:-400} python3 -m pytest -v -p no:cacheprovider $deferral \
    >> "$OUT/graph_tests.txt" 2>&1 || rc=$? ;;
esac
echo "graph-tests rc=$rc"; grep -E "PASSED|FAILED|ERROR|passed|failed|Error" \
  "$OUT/graph_tests.txt" | tail -30
