#!/bin/bash
# Here, before a GPU session: fill the git-ignored .gpu/ folder that the device
# calls carry (benchmarks/gpu/host_run.sh reads it there).
#
#   bash benchmarks/gpu/prepare.sh            # from the repository root
#
#   .gpu/p1..pN, host-setup.sh  vLLM 0.26.0 and its packages (../shared/gpu/pack.sh,
#                               about 5 minutes, skipped when the parts exist),
#                               re-split where they no longer fit a call beside
#                               the working tree (room.sh)
#   .gpu/wheel/                 this plugin as a wheel (its vllm.general_plugins entry
#                               point; the code itself comes from the checkout), and
#                               COMMIT, the tree packed and its hash (the result
#                               files' git_commit; benchmarks/gpu/tree.sh)
#   .gpu/models/                model shapes for dummy weights (config.json only;
#                               the shared ones and llama32_1b_fp8)
#   .gpu/data/                  the long-input prompts (serving workloads, evaluation)
#   .gpu/tokenizer/             a tokenizer for vllm serve and its client (SmolLM2's,
#                               converted once as scripts/demo.sh does), its vocabulary
#                               filled up to the model shapes' (pad_tokenizer)
#   .gpu/gguf/                  with GGUF=1: SmolLM2's GGUF in parts (real weights)
#
# Then, on the device: one call per part (`bash .gpu/host-setup.sh stage .gpu/pI`,
# carry .gpu/pI and .gpu/host-setup.sh), the last one also `install` and a phase
# (carry .gpu/wheel .gpu/models, and .gpu/data .gpu/tokenizer for serving). For
# serving, stage the last part alone and install in the next call: the last
# part, the data, the tokenizer and the repository pass a call's 64 MiB.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
SHARED=${SHARED:-$ROOT/../shared}
VENV=${SPECEXTEND_VENV:-$HOME/.cache/vllm-specextend/venv-cpu}

# RAY=1: Ray too (the `ray` executor under TP: host_run.sh serve12 with
# SERVE_EXECUTOR=ray), repacked; .gpu/ray marks parts that hold it. 2.60.0 ran
# vLLM 0.26's ray executor on these hosts (2026-11-22); about 79 MB more.
if [ "${RAY:-0}" = 1 ] && [ ! -f .gpu/ray ]; then
  rm -rf .gpu/p[0-9]* && bash "$SHARED/gpu/pack.sh" .gpu ray==2.60.0 && touch .gpu/ray
elif ! ls .gpu/p1 >/dev/null 2>&1; then
  bash "$SHARED/gpu/pack.sh" .gpu && rm -f .gpu/ray
fi
# The parts in order: pack.sh names them bundle.part.0, .1, ...; resplit_parts
# bundle.part.00, .01, ... (host-setup.sh joins /root/stage/bundle.part.* as the
# shell sorts them: one scheme at a time).
parts_in_order() {
  ls .gpu/p*/bundle.part.* | awk -F'bundle.part.' '{print $NF" "$0}' | sort -n | cut -d' ' -f2
}
# pack.sh's parts are 44 MiB; once the working tree passes 19 MiB they no
# longer travel beside it (the call is refused): the same bytes, re-split
# into parts of piece_mib.
resplit_parts() {
  local max=$(( $1 * 1024 * 1024 )) tmp before i=1 f
  ls .gpu/p*/bundle.part.* > /dev/null 2>&1 \
    || { echo "prepare.sh: no .gpu/p*/bundle.part.*: rm -rf .gpu/p* and run again" >&2; exit 1; }
  [ "$(stat -c %s $(parts_in_order) | sort -n | tail -n 1)" -le "$max" ] && return 0
  tmp=$(mktemp -d)
  before=$(cat $(parts_in_order) | sha256sum)
  cat $(parts_in_order) | split -b "$max" -d -a 2 - "$tmp/bundle.part."
  rm -rf .gpu/p[0-9]*
  for f in "$tmp"/bundle.part.*; do mkdir -p .gpu/p$i && mv "$f" .gpu/p$i/; i=$((i + 1)); done
  rmdir "$tmp"
  [ "$(cat $(parts_in_order) | sha256sum)" = "$before" ] \
    || { echo "prepare.sh: re-split parts differ from pack.sh's: rm -rf .gpu/p* and run again" >&2; exit 1; }
  echo "vLLM's parts re-split into $((i - 1)) of at most $1 MiB (the working tree has grown)"
}
source benchmarks/gpu/room.sh
room=$(piece_mib)
resplit_parts "$room"
rm -rf .gpu/wheel && mkdir -p .gpu/wheel
python3 -m pip wheel --no-deps -q -w .gpu/wheel . 2>&1 | grep -v '^WARNING' || true
# The tree packed, for the result files' meta.git_commit (host_run.sh exports
# it): the host's .git reports the commit its session started at. "-dirty":
# the code differed from HEAD (untracked files too); the hash: tree.sh.
commit=$(git rev-parse HEAD)
[ -z "$(git status --porcelain -- vllm_specextend benchmarks ':!benchmarks/results')" ] \
  || commit=$commit-dirty
source benchmarks/gpu/tree.sh
echo "$commit $(tree_hash)" > .gpu/wheel/COMMIT
rm -rf .gpu/models .gpu/data && mkdir -p .gpu/models .gpu/data
cp -r "$SHARED"/gpu/models/* .gpu/models/
# An fp8 checkpoint of the 1B draft's shape (vLLM 0.26 quantizes no draft at
# load: a draft's hf_overrides is a callable). Only it: the project's
# llama31_8b_eagle3 (2,048 positions) must not replace the shared one (64K).
cp -r benchmarks/models/configs/llama32_1b_fp8 .gpu/models/
cp -r "$SHARED"/data/govreport "$SHARED"/data/pg19 .gpu/data/
# chat_template.jinja: without it every chat request of the soak answers 400.
if [ ! -f .gpu/tokenizer/tokenizer.json ] || [ ! -f .gpu/tokenizer/chat_template.jinja ]; then
  models=${SPECEXTEND_MODELS:-$HOME/.cache/vllm-specextend/models}
  PYTHONPATH="$ROOT" "$VENV/bin/python" -m benchmarks.models.builders smollm2 \
    "$models/smollm2-135m-instruct" >/dev/null
  mkdir -p .gpu/tokenizer
  cp "$models"/smollm2-135m-instruct/tokenizer* "$models"/smollm2-135m-instruct/chat_template.jinja .gpu/tokenizer/
  cp "$models"/smollm2-135m-instruct/special_tokens_map.json .gpu/tokenizer/ 2>/dev/null || true
fi
# Filled up to the largest vocabulary of the model shapes (Llama 3's 128,256):
# dummy weights emit ids past SmolLM2's 49,152, and each of those stalls the
# API server's detokenizer (builders.pad_tokenizer says how much).
vocab=$("$VENV/bin/python" -c 'import json,sys; print(max(json.load(open(f))["vocab_size"] for f in sys.argv[1:]))' .gpu/models/*/config.json)
PYTHONPATH="$ROOT" "$VENV/bin/python" -m benchmarks.models.builders pad-tokenizer \
  .gpu/tokenizer .gpu/tokenizer --vocab-size "$vocab" >/dev/null
# GGUF=1: SmolLM2's real weights for the acceptance runs (host_run.sh gguf),
# in parts a call can carry.
if [ "${GGUF:-0}" = 1 ]; then
  pkg=$("$VENV/bin/python" -c 'from benchmarks.models.builders import find_smollm2_gguf as f; print(f().parent)')
  rm -rf .gpu/gguf && mkdir -p .gpu/gguf
  split -b 48M "$pkg"/*.gguf .gpu/gguf/part-
  cp "$pkg/__init__.py" .gpu/gguf/ && ls .gpu/gguf/part-* | wc -l > .gpu/gguf/count
  # transformers reads a GGUF through the `gguf` package, which the host's
  # python and the vLLM bundle lack (seen 2026-11-25): it travels too (pure
  # Python, 1.3 MB; its needs numpy, pyyaml, requests and tqdm are there).
  # Its dist-info too: transformers reads the installed version, and without
  # it stops on "Invalid version 'N/A'" (seen 2026-11-26).
  site=$("$VENV/bin/python" -c 'import gguf, pathlib; print(pathlib.Path(gguf.__file__).parent.parent)')
  tar -C "$site" -czf .gpu/gguf/gguf_pkg.tgz gguf $(cd "$site" && ls -d gguf-*.dist-info)
fi
du -sh .gpu/* | sort -k2
