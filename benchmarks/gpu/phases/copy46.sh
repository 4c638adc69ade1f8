# host_run.sh copy46: copy tasks (quote, edit) where retrieval matters, per
# mode, real weights.
# Feeds: issue #46; results/longinput/*_copy46_*,
#   copy_tasks_summary.{json,md}
#
# Issue #46, where retrieval matters: answers that quote a paragraph from
# 10-90% deep in the prompt, or repeat it with a name renamed
# (benchmarks/longinput/copytasks.py). SmolLM2-135M-Instruct drafts for
# itself: full KV, a 512-token window, CMR ranking with the final layer and
# with layer 21, compacted CMR at both (the target's checkpoint as a draft
# model with its own KV); vLLM's ngram prompt lookup at the same K (4);
# plain decoding first. Greedy, batch 1, COPY_PROMPTS (40) cases per task,
# source and length; plain decoding finds each answer's span that quotes
# the expected text, and the other modes run only the cases whose span has
# 16 tokens or more (for edit: past the first renamed name), and only the
# span. A process per source (COPY_SOURCE, "govreport pydoc") and length
# (COPY_LENGTH, "2048 4096 8192"), all side by side; their files come back
# as copy46.tgz, their summary (copy-summary) as copy_tasks_summary.{json,md}.
# The GGUF travels first (`gguf`). COPY_MODES narrows the modes (keep
# none: it screens), COPY_ARGS adds flags; merge calls' files with
# copy-summary.
# Expected time, estimated (not yet timed on a GPU) from grid23's H100 rows
# (8K: plain ~0.55 s, self modes 1-1.9 s per 256-token answer): per
# process 6 engine starts (~40 s each), 80 plain answers of at most 128
# tokens (~30 s), ~20 kept spans of 16-96 tokens x 7 mode runs (~1 min):
# about 5-6 minutes side by side, under side_by_side's 575 s a process. If
# one times out, split the modes over two calls (COPY_MODES="none self_full
# self_streaming self_cmr", then "none cmr_compact ngram").
smollm2_target copy46 || exit 1
SIDE_BY_SIDE_DATASETS=--copy-sources SIDE_BY_SIDE_LENGTHS=--copy-lengths \
  side_by_side copy46 "${COPY_SOURCE:-govreport pydoc}" "${COPY_LENGTH:-2048 4096 8192}" \
  --target /root/pair/target --draft /root/pair/target --tasks quote edit \
  --modes ${COPY_MODES:-none self_full self_streaming self_cmr cmr_compact ngram} \
  --score-layers -1 21 --working-sets 512 --batch-size 1 \
  --copy-prompts ${COPY_PROMPTS:-40} ${COPY_ARGS:-}
rc=$?
# Two processes or fewer leave their files in $OUT, more pack them.
mkdir -p /tmp/copy46 && rm -f /tmp/copy46/*.json
[ -f "$OUT/copy46.tgz" ] && tar -C /tmp/copy46 -xzf "$OUT/copy46.tgz" --wildcards '*.json'
cp "$OUT"/copy46_*.json /tmp/copy46/ 2>/dev/null
python3 -m benchmarks.longinput.eval_longinput copy-summary /tmp/copy46/*.json \
  --out "$OUT/copy_tasks_summary.json" > "$OUT/copy46_summary.log" 2>&1 || rc=$?
tail -40 "$OUT/copy46_summary.log"
echo "copy46 rc=$rc"; exit $rc
