# What a device call can carry beside the working tree, sourced by the
# prepare scripts: a call carries at most 64 MiB, the tree's tracked and
# untracked-not-ignored files included (../.library/device/README.md), and
# the tree grows with every session's result files.
#
# piece_mib: the largest piece, in whole MiB, that travels with today's tree;
# counted in disk blocks (du), as the limit behaves (a 44,460 KiB part beside
# a 22,432 KiB tree was refused, a 40,968 KiB one passed), 1 MiB kept spare.
piece_mib() {
  local tree_kib
  tree_kib=$(git ls-files -z -co --exclude-standard \
    | du -k -c --files0-from=- 2>/dev/null | tail -n 1 | cut -f1)
  echo $(( (64 * 1024 - tree_kib - 1024) / 1024 ))
}
