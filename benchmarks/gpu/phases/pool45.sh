# host_run.sh pool45: what draft_prompt_pool costs in accepted tokens, real
# weights.
# Feeds: issue #45; results/longinput/*_smollm2-self-copy_*_pool-*
#
# What draft_prompt_pool costs in accepted tokens with real weights (issue
# #45): as `options`, CMR at a 512-token working set with the draft's
# full pass (null, the default since 2026-12-06), and with pools of 32 and
# 48 chunks (12% and 19% of an 8K prompt, as 128 chunks are of 32K; a
# pooled pass must fit the 2,048-token chunks). The GGUF travels first
# (`gguf`).
smollm2_target pool45 || exit 1
configs_side_by_side pool45 "none cmr" \
  'none|/root/pair/target|{"draft_prompt_pool": null}' \
  'pool-32|/root/pair/target|{"draft_prompt_pool": 32}' \
  'pool-48|/root/pair/target|{"draft_prompt_pool": 48}'
rc=$?; echo "pool45 rc=$rc"; exit $rc
