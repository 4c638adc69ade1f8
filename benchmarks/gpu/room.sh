# What a device call can carry beside the working tree, sourced by the
# prepare scripts: a call carries at most 64 MiB, the tree's tracked and
# untracked-not-ignored files included (../.library/device/README.md), and
# the tree grows with every session's result files.
#
# piece_mib: the largest piece, in whole MiB, that travels with today's tree;
# counted in disk blocks (du), as the limit behaves (a 44,460 KiB part beside
# a 22,432 KiB tree was refused, a 40,968 KiB one passed), 1 MiB kept spare.
# Below 8 MiB it stops, naming the tree's size: too many calls a session.
piece_mib() {
  local tree_kib mib
  tree_kib=$(git ls-files -z -co --exclude-standard \
    | du -k -c --files0-from=- 2>/dev/null | tail -n 1 | cut -f1)
  mib=$(( (64 * 1024 - tree_kib - 1024) / 1024 ))
  if [ "$mib" -lt 8 ]; then
    echo "room.sh: the working tree takes $((tree_kib / 1024)) MiB of a device call's 64:" \
      "under 8 MiB left for a piece; move large result files out of the tree" >&2
    return 1
  fi
  echo "$mib"
}
