# host_run.sh analyses: the distilled pair's sweep and needle analyses
# (eval_longinput).
# Feeds: docs/evaluation.md; results/longinput/
timeout 575 python3 -m benchmarks.longinput.eval_longinput run --target /root/pair/target \
  --draft /root/pair/draft --tasks sweep needle --datasets govreport \
  --out "$OUT/analyses.json" > "$OUT/analyses.log" 2>&1
rc=$?; echo "analyses rc=$rc"; cat "$OUT/analyses.md"; exit $rc
