# host_run.sh tp-speed: decode speed under tensor parallelism, fresh prompts.
# Feeds: issue #44; results/tp/*.json
#
# Issue #44: decode speed under tensor parallelism, fresh prompts (each run
# prefills; end to end beside decode), 1,024 new tokens, 3 runs a cell.
# TP_TARGET 70b (Llama-3.1-70B shape, TP_SIZE 4) or 8b (TP_SIZE 2), the 1B
# shape as draft; every mode with tp_flags (the fusion off) and
# symmetric-memory all-reduce off. An engine per mode
# (TP_MODES, one or two per call: a 70B engine takes minutes to start);
# TP_CONTEXTS, TP_BATCHES name the cells; TP_ARGS adds flags; TP_TAG ends
# the files' names (a variant: TP_ARGS='--spec-extend {"top_k":32,
# "recent_tokens":256,"draft_placement":"sharded"}' TP_TAG=sharded, no
# spaces in the JSON). TP_DRAFT: another draft shape (llama32_1b_fp8: the
# 1B as an fp8 checkpoint; a lever where the draft's weights, not its
# collectives, bound a replicated draft); it names the files too.
export VLLM_ALLREDUCE_USE_SYMM_MEM=0
stop_leftovers || exit 1
target=${TP_TARGET:-70b}; size=${TP_SIZE:-4}
case $target in 70b) cfg=$M/llama31_70b ;; 8b) cfg=$M/llama31_8b ;;
  *) echo "TP_TARGET: 70b or 8b" >&2; exit 2 ;; esac
tdraft=${TP_DRAFT:-llama32_1b}; dname=1b; [ "$tdraft" = llama32_1b_fp8 ] && dname=1b-fp8
[ "$tdraft" = llama32_1b ] || [ "$tdraft" = llama32_1b_fp8 ] || dname=$tdraft
modes=${TP_MODES:-spec_extend plain}; tag=${target}-${dname}_tp${size}_$(echo $modes | tr ' ' -)${TP_TAG:+_$TP_TAG}
timeout ${TP_TIMEOUT:-570} python3 -m benchmarks.decode.bench_decode --target-config $cfg \
  --draft-config $M/$tdraft --contexts ${TP_CONTEXTS:-32768} \
  --batch-sizes ${TP_BATCHES:-1} --output-len 1024 --runs 3 --fresh-prompts \
  $(tp_flags "$size") --modes $modes ${TP_ARGS:-} \
  --out "$OUT/decode_$tag.json" > "$OUT/decode_$tag.log" 2>&1
echo "tp-speed rc=$?"; python3 -m benchmarks.decode.summarize_decode "$OUT/decode_$tag.json"
grep -m3 -E "Error|error:|draft routine" "$OUT/decode_$tag.log"
grep -m4 -iE "allreduce backend|Allreduce norm fusion|AllReduceFusion" "$OUT/decode_$tag.log"
