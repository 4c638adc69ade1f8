# host_run.sh tp-lossless: greedy outputs alike at TP=1, TP=2 (mp) and TP=2
# (ray), plain and spec_extend.
# Feeds: issue #44; results/tp/tp_lossless_*.json
#
# Real random checkpoints: dummy weights differ with the TP degree.
python3 -c "from benchmarks.models.builders import build_tiny_llama as b
t = b('/root/m/tgt', seed=0, hidden_size=1024, num_layers=8, num_heads=16, num_kv_heads=8, max_position_embeddings=32768)
b('/root/m/drf', seed=1, hidden_size=512, num_layers=2, num_heads=8, num_kv_heads=4, max_position_embeddings=32768, tokenizer_dir=t)"
for run in "1" "2 --distributed-executor-backend mp" "2 --distributed-executor-backend ray"; do
  tag=$(echo "$run" | tr -cd '0-9a-z')
  timeout 280 python3 -m benchmarks.decode.bench_decode --target-config /root/m/tgt \
    --draft-config /root/m/drf --modes plain spec_extend --load-format auto \
    --dtype float32 --acceptance-length 0 --contexts 4096 16384 --batch-sizes 1 4 \
    --output-len 64 --runs 1 --enforce-eager --tensor-parallel-size $run \
    --out "$OUT/tp_lossless_$tag.json" > "$OUT/tp_lossless_$tag.log" 2>&1
  echo "tp $run rc=$?"; grep -m3 -E "Error|error:" "$OUT/tp_lossless_$tag.log"
done
python3 - "$OUT" <<'PY'
import json, sys, pathlib
for f in sorted(pathlib.Path(sys.argv[1]).glob("tp_lossless_*.json")):
    for r in json.loads(f.read_text())["results"]:
        run = r["runs"][0]
        print(f.stem, r["mode"], r["context"], r["batch"], run["output_sha256"][:12],
              (run.get("spec_extend") or {}).get("view_rows"))
PY
