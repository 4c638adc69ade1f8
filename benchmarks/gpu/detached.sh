# Runs longer than one device call (10 minutes at most): sourced by host_run.sh.
#
#   detached DIR WAIT_S CMD...
#
# starts CMD in a session of its own (setsid: it outlives the call that
# started it) unless DIR/started exists, then waits at most WAIT_S seconds
# for it to end. Calling it again (the machine stays warm 30 s between
# calls) starts nothing and waits again. Its output goes to DIR/runner.log,
# its exit status to DIR/rc. Returns 0 once CMD has ended, 1 while it runs.
# DETACHED_ROOT holds every DIR, so `detached_running` can tell whether one
# is going (leftover-stopping must leave it alone). A later call that lands
# on a fresh machine (the warm window missed) would start over: begin it with
# `[ -f DIR/started ] || exit 3`.
DETACHED_ROOT=${DETACHED_ROOT:-/root/detached}

detached() {
  local dir=$1 wait_s=$2; shift 2
  mkdir -p "$dir"
  if [ ! -f "$dir/started" ]; then
    printf '%q ' "$@" > "$dir/cmd.sh"
    touch "$dir/started"
    setsid bash -c "bash '$dir/cmd.sh' > '$dir/runner.log' 2>&1; echo \$? > '$dir/rc'" \
      < /dev/null > /dev/null 2>&1 &
    echo "$(basename "$dir"): started (log: $dir/runner.log)"
  fi
  local end=$((SECONDS + wait_s))
  while [ ! -f "$dir/rc" ] && [ $SECONDS -lt $end ]; do sleep 1; done
  tail -12 "$dir/runner.log" 2>/dev/null | cut -c1-400
  if [ -f "$dir/rc" ]; then
    echo "$(basename "$dir") rc=$(cat "$dir/rc")"; return 0
  fi
  echo "$(basename "$dir"): still running; call the phase again within 30 s"; return 1
}

# The name of a detached run that has started and not ended, if any.
detached_running() {
  local d
  for d in "$DETACHED_ROOT"/*/; do
    [ -f "$d/started" ] && [ ! -f "$d/rc" ] && { basename "$d"; return 0; }
  done
  return 1
}
