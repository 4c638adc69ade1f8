# host_run.sh needle: passkey retrieval (needle) with the distilled pair, per
# drafting mode.
# Feeds: docs/evaluation.md; results/longinput/*needle*
timeout 560 python3 -m benchmarks.longinput.eval_longinput run --target /root/pair/target \
  --draft /root/pair/draft --tasks needle --datasets govreport \
  --modes draft_model streaming cmr cmr_compact --out "$OUT/needle.json" \
  > "$OUT/needle.log" 2>&1
rc=$?; echo "needle rc=$rc"; grep '^|' "$OUT/needle.md"; exit $rc
