#!/bin/bash
# On the offline GPU host: the real pair from the pieces prepare.sh made, then
# the grid, one engine per mode, modes one after another. From the repository
# root, after ../shared/gpu/host-setup.sh installed vLLM into /root/vsite.
#
#   bash benchmarks/realpair/host.sh stage DIR     move a carried piece folder
#                                                  (.gpu/pair/tNN) to /root/pair/stage
#   bash benchmarks/realpair/host.sh early         after the target's last piece
#                                                  (carry .gpu/pair/kit/gguf_pkg.tgz
#                                                  and .gpu/pair/manifest.json):
#                                                  its join and conversion, detached
#   bash benchmarks/realpair/host.sh build         plugin wheel + gguf installed,
#                                                  arctic-inference into /root/arctic
#                                                  (the suffix mode's alone: grid.sh);
#                                                  join, check, convert -> /root/pair
#   bash benchmarks/realpair/host.sh grid TAG "MODE[:K][@CELL,..] ..." "CELL ..."
#        detached (setsid): one run.py a mode into /root/pair/out/TAG/;
#        `status TAG` prints its log and packs what is done into $OUT/TAG.tgz,
#        `wait TAG [SECS]` the same once it is done or SECS (540) passed: chain
#        these calls, since the host goes back 30 s after a call returns.
#        CELL: group:context:batch (tasks.py, run.py).
#   bash benchmarks/realpair/host.sh profile TAG "MODE[:K] ..." group:context[:batch]
#        the same, detached: a step profile a mode (profile.py; at a batch
#        over 1, the first call's first-token window instead), into
#        /root/pair/out/TAG/ (trace_*.json stay there: status packs only
#        the summaries and logs).
#   bash benchmarks/realpair/host.sh forecast PLAIN.json [--cells ..]
#        the draft's (and, as a check, the target's) greedy token at every
#        position of PLAIN.json's batch-1 answers, teacher-forced (forecast.py;
#        in the foreground: not yet run on a host, so give it --cells first)
#        -> $OUT/forecast.json
#   bash benchmarks/realpair/host.sh shapes TAG "MODE[:K] ..." group:context[:batch]
#        the same profile on the pair's shapes with dummy weights (carry
#        .gpu/pair/shapes and .gpu/wheel in that call: no pieces, no build):
#        speed only, such as where a batch's first tokens wait.
set -uo pipefail
export PYTHONPATH=$PWD:/root/vsite PYTHONUNBUFFERED=1
P=${PAIR_DIR:-/root/pair}
mkdir -p $P/stage $P/out

# arctic-inference, which vLLM's `suffix` mode imports (benchmarks/realpair/
# arctic.py), into its own folder: grid.sh puts it on that mode's path alone.
arctic_install() {
  local dir=${ARCTIC_DIR:-/root/arctic} wheel
  rm -rf "$dir"
  wheel=$(ls .gpu/pair/kit/arctic_inference-*.whl 2>/dev/null | tail -n 1)
  if [ -z "$wheel" ]; then
    echo "no arctic-inference wheel in .gpu/pair/kit: the suffix mode will fail (prepare.sh builds it)"
    return 0
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$dir" "$wheel" 2>&1 \
    | grep -v WARNING
  PYTHONPATH=$PYTHONPATH:$dir python3 -m benchmarks.realpair.arctic check
}
# The plugin's wheel into vLLM's site, once the detached install from the call
# that staged vLLM's last part is done.
plugin_install() {
  for _ in $(seq 300); do [ -f /root/vsite/.done ] && break; sleep 1; done
  [ -f /root/vsite/.done ] || { echo "vLLM is not installed in /root/vsite" >&2; exit 2; }
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade \
    --target /root/vsite .gpu/wheel/*.whl 2>&1 | grep -v WARNING
}
# grid.sh detached: TAG FLAG CASES TARGET DRAFT MODES CELLS. SPECEXTEND_COMMIT:
# the tree prepare.sh packed (benchmarks/gpu/host_run.sh).
start_grid() {
  SPECEXTEND_COMMIT=$(cut -d' ' -f1 .gpu/wheel/COMMIT 2>/dev/null) \
    setsid bash benchmarks/realpair/grid.sh $2 $P/out/$1 "$3" "$4" "$5" "$6" "$7" \
    > $P/out/$1.log 2>&1 < /dev/null &
  echo "started $1"
}
# The target joined and converted, detached, from the call that stages its
# last piece, while the draft's pieces still travel: its conversion took 110
# s of build's 120 on an H100 host (2026-12-07). Run from copies of the
# joiner's package and the gguf package: the device tool re-copies the
# working tree at every call (a detached run that imported from it failed
# once, 2026-12-07). It waits for vLLM's detached install (transformers);
# build waits for it in turn (early.pid, early.rc).
early_target() {
  local tool=${PAIRTOOL_DIR:-/root/pairtool} vsite=${VSITE_DIR:-/root/vsite} f
  for f in .gpu/pair/kit/gguf_pkg.tgz .gpu/pair/manifest.json; do
    if [ ! -f $f ]; then
      echo "early: no $f: carry .gpu/pair/kit/gguf_pkg.tgz and" \
        ".gpu/pair/manifest.json in this call" >&2
      exit 2
    fi
  done
  rm -rf $tool $P/early.pid $P/early.rc && mkdir -p $tool/benchmarks
  cp -r benchmarks/__init__.py benchmarks/models $tool/benchmarks/
  cp .gpu/pair/kit/gguf_pkg.tgz $tool/ && cp .gpu/pair/manifest.json $P/stage/
  (cd $tool && PYTHONPATH=$tool:$vsite setsid bash -c "
    echo \$\$ > $P/early.pid
    for _ in \$(seq 600); do [ -f $vsite/.done ] && break; sleep 1; done
    if [ ! -f $vsite/.done ]; then
      echo 'early: vLLM is not installed in $vsite after 600 s'; echo 3 > $P/early.rc
      exit 3
    fi
    tar -C $vsite -xzf gguf_pkg.tgz
    python3 -m benchmarks.models.qwen_pair join $P/stage $P --role target
    echo \$? > $P/early.rc.tmp && mv $P/early.rc.tmp $P/early.rc
    " > $P/convert_target_early.log 2>&1 < /dev/null &)
  echo "target: joining and converting, detached ($P/convert_target_early.log)"
}
# build: wait for early's job where one started, never racing it (the
# conversion build then runs finds the target built, or makes it itself).
wait_early() {
  local pid
  [ -f $P/early.pid ] || return 0  # none started (its job writes it first)
  pid=$(cat $P/early.pid)
  for _ in $(seq 300); do
    [ -f $P/early.rc ] || ! kill -0 "$pid" 2>/dev/null && break
    sleep 1
  done
  if [ ! -f $P/early.rc ] && kill -0 "$pid" 2>/dev/null; then
    echo "the early target conversion (pid $pid) still runs after 300 s" >&2
    exit 2
  fi
  echo "target converted early: rc=$(cat $P/early.rc 2>/dev/null || echo none)"
  tail -n 1 $P/convert_target_early.log
}
case "${1:-}" in
  stage)
    mv "$2"/* $P/stage/ && ls $P/stage | wc -l ;;
  early)
    early_target ;;
  build)
    plugin_install
    wait_early
    tar -C /root/vsite -xzf .gpu/pair/kit/gguf_pkg.tgz
    arctic_install
    cp .gpu/pair/manifest.json $P/stage/ && cp .gpu/pair/kit/cases.jsonl.gz $P/
    t0=$(date +%s)
    # Joined and checked, then both converted at once (each one process's
    # numpy dequantizing: about 1 minute for the 0.5B on a 2-core CPU).
    python3 -m benchmarks.models.qwen_pair join $P/stage $P --no-convert || exit 2
    rm -rf $P/stage
    python3 -m benchmarks.models.qwen_pair convert $P/gguf/draft.gguf \
      $P/qwen25coder-0.5b-instruct > $P/convert_draft.log 2>&1 &
    python3 -m benchmarks.models.qwen_pair convert $P/gguf/target.gguf \
      $P/qwen25coder-1.5b-instruct > $P/convert_target.log 2>&1
    wait
    tail -n 2 $P/convert_*.log
    # The draft's fp8 copy (run.py's spec_extend_fp8draft): seconds.
    python3 -m benchmarks.models.builders fp8 $P/qwen25coder-0.5b-instruct \
      $P/qwen25coder-0.5b-instruct-fp8 > $P/convert_fp8.log 2>&1 || tail -n 3 $P/convert_fp8.log
    [ -f $P/qwen25coder-0.5b-instruct/config.json ] && [ -f $P/qwen25coder-1.5b-instruct/config.json ] \
      && echo "pair built in $(( $(date +%s) - t0 )) s" ;;
  forecast)
    plain=$2; shift 2  # the rest: forecast.py's own (--cells, --limit)
    python3 -m benchmarks.realpair.forecast --cases $P/cases.jsonl.gz --outputs "$plain" \
      --model $P/qwen25coder-0.5b-instruct --model $P/qwen25coder-1.5b-instruct \
      --out "$OUT/forecast.json" "$@" > $P/forecast.log 2>&1
    echo "forecast rc=$? $(grep -c 'tokens as' $P/forecast.log) answers"
    tail -n 2 $P/forecast.log ;;
  shapes)
    plugin_install
    rm -rf /root/shapes && cp -r .gpu/pair/shapes /root/shapes
    ENGINE_ARGS='{"load_format": "dummy"}' start_grid "$2" --profile \
      /root/shapes/cases.jsonl.gz /root/shapes/target /root/shapes/draft "$3" "$4" ;;
  grid|profile)
    flag=; [ "$1" = profile ] && flag=--profile
    start_grid "$2" "$flag" $P/cases.jsonl.gz $P/qwen25coder-1.5b-instruct \
      $P/qwen25coder-0.5b-instruct "$3" "$4" ;;
  status|wait)
    # wait: a call that holds the machine while the detached grid runs (the host
    # goes back 30 s after a call returns), until it prints "done" or SECS pass.
    end=$((SECONDS + ${3:-540}))
    while [ "$1" = wait ] && [ $SECONDS -lt $end ] && ! grep -q '^done' $P/out/$2.log; do
      sleep 5
    done
    cat $P/out/$2.log
    tar -C $P/out -czf "$OUT/$2.tgz" --exclude='trace_*' "$2" "$2.log" ;;
  *) sed -n 2,31p "$0" >&2; exit 2 ;;
esac
