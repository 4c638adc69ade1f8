#!/bin/bash
# On the offline GPU host, after ../shared/gpu/host-setup.sh has installed vLLM
# into /root/vsite: install this plugin (and pytest) from carried wheels, then
# run one phase, writing results and logs under $OUT.
#
#   bash benchmarks/gpu/host_run.sh kernels|decode-68m|decode-1b
set -uo pipefail
export PYTHONPATH=/root/vsite PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
M=.gpu/models
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade \
  --target /root/vsite .gpu/wheel/*.whl 2>&1 | grep -v WARNING
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt"
case "$1" in
  kernels)
    timeout 200 python3 -m pytest tests/kernels -q -p no:cacheprovider \
      > "$OUT/kernels.txt" 2>&1; tail -3 "$OUT/kernels.txt"
    timeout 120 python3 benchmarks/bench_scoring.py --out "$OUT/scoring.json" \
      > "$OUT/scoring.log" 2>&1; tail -20 "$OUT/scoring.log" ;;
  decode-68m)
    timeout 560 python3 benchmarks/bench_decode.py --target-config $M/llama31_8b \
      --draft-config $M/llama_68m --out "$OUT/decode_68m.json" > "$OUT/decode_68m.log" 2>&1
    grep '^{' "$OUT/decode_68m.log" | cut -c1-220; grep -m3 -i "error" "$OUT/decode_68m.log" ;;
  decode-1b)
    timeout 560 python3 benchmarks/bench_decode.py --target-config $M/llama31_8b \
      --draft-config $M/llama32_1b --modes draft_model spec_extend \
      --out "$OUT/decode_1b.json" > "$OUT/decode_1b.log" 2>&1
    grep '^{' "$OUT/decode_1b.log" | cut -c1-220; grep -m3 -i "error" "$OUT/decode_1b.log" ;;
  capture)
    timeout 500 python3 -m pytest tests/kernels/test_capture_gpu.py -q -x -p no:cacheprovider \
      > "$OUT/capture.txt" 2>&1; grep -E "passed|failed|Error|assert" "$OUT/capture.txt" | tail -8 ;;
  profile-68m)
    timeout 560 python3 benchmarks/bench_decode.py --target-config $M/llama31_8b \
      --draft-config $M/llama_68m --modes draft_model spec_extend --contexts 4096 32768 \
      --profile --out "$OUT/profile_68m.json" > "$OUT/profile_68m.log" 2>&1
    grep '^{' "$OUT/profile_68m.log" | cut -c1-220 ;;
  *) echo "usage: host_run.sh kernels|capture|decode-68m|decode-1b|profile-68m" >&2; exit 2 ;;
esac
