# host_run.sh options: what the opt-in speed keys cost in accepted tokens,
# real weights.
# Feeds: issues #22, #26;
#   results/longinput/*_smollm2-self-copy_8k_*_{no-key,vocab-12288,window-2048}.*
#
# What the opt-in speed keys cost in accepted tokens with real weights
# (issue #26's draft_vocab, #22's draft_prefill_window): SmolLM2-135M-
# Instruct drafts for itself, so a token a key loses is its approximation's,
# not the draft's. CMR at a 512-token working set with no key, then each
# key alone, plain decoding beside each for the greedy check. The GGUF
# travels first (`gguf`). OPTIONS_LENGTH, OPTIONS_DATASET, OPTIONS_ARGS
# (e.g. --num-prompts) narrow or widen it.
smollm2_target options || exit 1
configs_side_by_side options "none cmr" \
  'none|/root/pair/target|{}' \
  'vocab-12288|/root/pair/target|{"draft_vocab": 12288}' \
  'window-2048|/root/pair/target|{"draft_prefill_window": 2048}'
rc=$?; echo "options rc=$rc"; exit $rc
