#!/bin/bash
# arctic-inference's suffix tree, which vLLM's own `suffix` method imports
# (benchmarks/realpair/arctic.py), as a CPython 3.12 wheel for the offline GPU
# host (no compiler there): built here from PyPI's source archive (0.3.0 has
# no wheel), checked, and kept in DIR; a wheel already there is reused.
#
#   bash benchmarks/realpair/arctic_wheel.sh DIR
#        -> DIR/arctic_inference-0.3.0-cp312-cp312-linux_x86_64.whl
#
# The suffix-tree part only: the sdist's setup.py imports torch before it
# builds anything (for its CUDA ops, which it skips unless
# ARCTIC_INFERENCE_PRECOMPILED_OPS=1), and PyPI's torch for 3.12 does not
# import without its CUDA libraries (GBs). So the extension is built as that
# setup.py's CMakeBuild builds it (csrc/suffix_decoding, nanobind 2.9.2 as the
# sdist pins, Release) and packed with arctic_inference/__init__.py and
# arctic_inference/suffix_decoding/: no vLLM plugin, so none of Arctic's patches.
# PY312: the interpreter (pyenv's 3.12.1); its build venv stays in DIR/venv.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: arctic_wheel.sh DIR}
PY312=${PY312:-$HOME/.pyenv/versions/3.12.1/bin/python}
name=arctic_inference-0.3.0
url=https://files.pythonhosted.org/packages/63/c1/573fa2f00097cd9cc1167b31fd900b2482f58f3491867cebdd5516626533/$name.tar.gz
sha256=7f22e3e1b1071c6061c0d6951be17c0fb50b08d06d6e543144c8f52faba60a36
wheel=$name-cp312-cp312-linux_x86_64.whl
[ -f "$out/$wheel" ] && { echo "reused $out/$wheel"; exit 0; }
"$PY312" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null || {
  echo "PY312=$PY312 is no CPython 3.12 (the host's): pyenv install 3.12, or set PY312" >&2
  exit 1; }
mkdir -p "$out"
[ -f "$out/$name.tar.gz" ] || curl -fsSL -o "$out/$name.tar.gz" "$url"
echo "$sha256  $out/$name.tar.gz" | sha256sum -c --quiet
[ -x "$out/venv/bin/python" ] || "$PY312" -m venv "$out/venv"
"$out/venv/bin/python" -m pip install -q nanobind==2.9.2 wheel numpy 2>&1 | grep -v "^WARNING: Location" || true
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -C "$work" -xzf "$out/$name.tar.gz"
src=$work/$name stage=$work/stage/$name
pkg=$stage/arctic_inference
mkdir -p "$pkg/suffix_decoding" "$stage/$name.dist-info" "$work/dist"
cmake -S "$src/csrc/suffix_decoding" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
  -DPython_EXECUTABLE="$out/venv/bin/python" \
  -DCMAKE_LIBRARY_OUTPUT_DIRECTORY="$pkg/suffix_decoding" > "$work/cmake.log" 2>&1 \
  && cmake --build "$work/build" -j "$(nproc)" >> "$work/cmake.log" 2>&1 \
  || { tail -n 30 "$work/cmake.log" >&2; exit 1; }
cp "$src/arctic_inference/__init__.py" "$pkg/"
cp "$src"/arctic_inference/suffix_decoding/*.py "$pkg/suffix_decoding/"
cp "$src/LICENSE" "$stage/$name.dist-info/"
printf '%s\n' "Metadata-Version: 2.1" "Name: arctic_inference" "Version: 0.3.0" \
  "Summary: Snowflake's arctic-inference, suffix decoding only (vllm-specextend's benchmarks/realpair/arctic_wheel.sh)" \
  "License-File: LICENSE" > "$stage/$name.dist-info/METADATA"
printf '%s\n' "Wheel-Version: 1.0" "Generator: benchmarks/realpair/arctic_wheel.sh" \
  "Root-Is-Purelib: false" "Tag: cp312-cp312-linux_x86_64" > "$stage/$name.dist-info/WHEEL"
"$out/venv/bin/python" -m wheel pack "$stage" -d "$work/dist" > /dev/null
# The check: installed on its own, as on the host, it drafts.
"$out/venv/bin/python" -m pip install -q --no-index --no-deps --target "$work/site" "$work/dist/$wheel"
PYTHONPATH="$work/site:$ROOT" "$out/venv/bin/python" -m benchmarks.realpair.arctic check
mv "$work/dist/$wheel" "$out/"
echo "built $out/$wheel"
