# host_run.sh fp8draft: what an fp8 draft costs in accepted tokens, real
# weights.
# Feeds: issue #26;
#   results/longinput/*_smollm2-self-copy_8k_*_{bf16,fp8}-draft.*
#
# What an fp8 draft costs in accepted tokens with real weights (issue
# #26: +6.8% at 64K, batch 1, with the 1B shape): SmolLM2-135M-Instruct
# drafts for itself as it is (bf16) and as an fp8 copy (builders.build_fp8:
# per-tensor e4m3 weights of the decoder's linears, activations quantized
# per token), under vLLM's own speculation (whole KV) and CMR at a
# 512-token working set, plain decoding beside them; otherwise as
# `options` (four processes, files back as fp8draft.tgz).
smollm2_target fp8draft || exit 1
[ -d /root/pair/target_fp8 ] || PYTHONPATH=/root/vsite timeout 300 python3 -m \
  benchmarks.models.builders fp8 /root/pair/target /root/pair/target_fp8 \
  > "$OUT/fp8draft_build.log" 2>&1 \
  || { echo "fp8draft: no fp8 copy"; tail -5 "$OUT/fp8draft_build.log"; exit 1; }
configs_side_by_side fp8draft "none draft_model cmr" \
  'bf16|/root/pair/target|{}' 'fp8|/root/pair/target_fp8|{}'
rc=$?; echo "fp8draft rc=$rc"; exit $rc
