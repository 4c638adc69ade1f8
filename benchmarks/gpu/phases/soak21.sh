# host_run.sh soak21: a 10-minute soak of vllm serve --spec-extend (detached,
# two calls).
# Feeds: issue #21; results/soak/*.json
#
# Issue #21's soak (benchmarks/serve/soak.py; docs/testing.md, "Soak"): vllm serve
# --spec-extend, 8B/1B shapes, dummy weights, K=4, real rejection sampling
# (SOAK_ACCEPTANCE=0, the default: the probes are compared with a plain
# server's, started first; SOAK_ACCEPTANCE=3.0: synthetic, no comparison),
# the plugin's default config and scheduling, for SOAK_DURATION_S (600) at 32
# clients, inputs of 1K-32K tokens, up to 512 new tokens, 20% closed by their
# client, 5% malformed. KV cache: 12 GiB is ~78K tokens at 160 KiB per token
# (target + draft), room for two requests of max-model-len (33792), while 32
# clients want ~290K (log-uniform 1K-32K: ~9K a prompt): vLLM preempts.
# Probes: before == after, and == plain decoding's (real rejection only).
# The servers' starts (plain ~1.5 min, spec ~2.5) and a 10-minute soak do not fit a 10-minute
# call, so the runner starts in a session of its own (setsid: it outlives
# the call) and the call waits for it at most SOAK_WAIT_S (555). Call the
# phase again within the machine's 30 s warm window: it starts nothing new,
# waits again, and once the runner has ended copies the result file, the
# runner's log and the server logs to $OUT. Two calls, ~16 min of device
# time. SOAK_FRESH=1 starts over; SOAK_ARGS adds runner flags,
# SOAK_SERVER_ARGS server flags. A run that needs no timing (#23's grid)
# can share the GPU with the soak: give the soak's servers
# SOAK_SERVER_ARGS="--gpu-memory-utilization 0.6" (with a fixed KV cache
# it only sets vLLM's startup check that much memory is free) and start
# the co-tenant after the soak (SOAK_WAIT_S=30). Carry .gpu/wheel
# .gpu/models .gpu/data .gpu/tokenizer.
dir=$DETACHED_ROOT/soak21
[ "${SOAK_FRESH:-0}" = 1 ] && rm -rf $dir
[ -f $dir/started ] || stop_leftovers || exit 3
detached $dir ${SOAK_WAIT_S:-555} python3 -m benchmarks.serve.soak --target $M/llama31_8b \
  --draft $M/llama32_1b --tokenizer .gpu/tokenizer \
  --duration-s ${SOAK_DURATION_S:-600} --concurrency 32 --min-input-len 1024 \
  --max-input-len 32768 --max-output-len 512 --num-spec-tokens 4 \
  --acceptance-length ${SOAK_ACCEPTANCE:-0} --out-dir $dir/out ${SOAK_ARGS:-} \
  -- --load-format dummy --max-model-len 33792 --kv-cache-memory-bytes 12G \
  ${SOAK_SERVER_ARGS:-} || exit 0
cp $dir/out/*.json $dir/runner.log "$OUT"/
tar -C $dir/out --exclude='*.json' -czf "$OUT/soak21_logs.tgz" .
