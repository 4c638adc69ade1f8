# host_run.sh viewattn: the draft's attention over its view: FA3 against a
# Triton kernel.
# Feeds: issue #26; results/decode/*_view-attention-microbench*.json
#
# Issue #26: the draft's attention over its view, FA3 against the one-launch
# Triton prototype, as CUDA-graph replays (view_attention_bench.py); only
# torch, Triton and vLLM's FA3, no engine: about a minute.
timeout 400 python3 -m benchmarks.gpu.view_attention_bench \
  --out "$OUT/view_attention.json" ${VIEWATTN_ARGS:-} > "$OUT/view_attention.log" 2>&1
rc=$?; grep -E "^reqs|Error" "$OUT/view_attention.log"; echo "viewattn rc=$rc"; exit $rc
