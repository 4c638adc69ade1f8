# host_run.sh eval: the long-input evaluation with the distilled pair, a
# process a dataset.
# Feeds: docs/evaluation.md; results/longinput/*_distilled_*
#
# EVAL_DATASET: one dataset or several ("govreport pg19"), EVAL_LENGTHS:
# none (then EVAL_ARGS may name --lengths) or several ("2048 4096"), run
# side by side, a process each; EVAL_ARGS narrows it (--modes) to fit a
# call; merge the files with `report`. The call's exit status is the
# evaluations'.
side_by_side eval "${EVAL_DATASET:-govreport}" "${EVAL_LENGTHS:-}" \
  --target /root/pair/target --draft /root/pair/draft ${EVAL_ARGS:-}
rc=$?; echo "eval rc=$rc"; exit $rc
