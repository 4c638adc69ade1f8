# host_run.sh grid23: self-drafting SmolLM2 by working set against plain
# decoding, real weights.
# Feeds: issue #23; results/longinput/*_selfdraft_*
#
# Issue #23's grid: SmolLM2-135M-Instruct drafting for itself (self_full,
# and self_streaming / self_cmr at working sets of 256, 512 and 1024
# tokens) against plain decoding: 20 prompts, 256 new tokens, batch 1
# (an interval over prompts), greedy, what each working set held of the
# target's attention (--coverage). The GGUF travels first (the `gguf`
# phase, once per part); the target is built once
# per machine (/root/pair/target). GRID_LENGTH one length or several
# (8192 first: the done-when cell), GRID_DATASET one dataset or several
# ("govreport pg19"): side by side, a process and a file each; GRID_ARGS adds or
# overrides flags (passkeys: --tasks needle --needle-lengths 4096 8192;
# many haystacks for the few the target answers: --needle-prompts 40
# --needle-screen). Merge the files with `report`.
smollm2_target grid23 || exit 1
side_by_side grid23 "${GRID_DATASET:-govreport}" "${GRID_LENGTH:-8192}" \
  --target /root/pair/target \
  --modes none self_full self_streaming self_cmr --working-sets 256 512 1024 \
  --num-prompts 20 --max-new-tokens 256 --batch-size 1 \
  --coverage ${GRID_ARGS:-}
rc=$?; echo "grid23 rc=$rc"; exit $rc
