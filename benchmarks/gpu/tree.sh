# The plugin's and the benches' sources as one short hash, from the repository
# root: prepare.sh stores it beside the commit it packs (.gpu/wheel/COMMIT),
# host_run.sh hashes the tree a call carried, and a result file's git_commit
# says "-stale" where the two differ (a commit or an edit after prepare.sh).
tree_hash() {
  find vllm_specextend benchmarks -path benchmarks/results -prune -o -type f \
    \( -name '*.py' -o -name '*.sh' \) -print | LC_ALL=C sort | xargs sha1sum \
    | sha1sum | cut -c1-12
}
