# host_run.sh eagle3: decode speed with a dummy EAGLE-3 head, with and
# without the plugin.
# Feeds: results/decode/*_8b-eagle3*.{json,md}
#
# Dummy EAGLE-3 head (2048 positions, committed config) on the 8B shape. Past
# 2048 tokens vLLM alone never runs the head ("no draft"; the synthetic sampler
# still accepts its token-0 placeholders, so its tok/s is no baseline): its
# engine goes last, so spec_extend's rows come first if time runs out.
timeout 540 python3 -m benchmarks.decode.bench_decode --target-config $M/llama31_8b \
  --draft-config benchmarks/models/configs/llama31_8b_eagle3 --method eagle3 \
  --modes plain spec_extend draft_model --contexts 4096 16384 32768 --batch-sizes 1 \
  --output-len 128 --runs 3 --spec-extend '{"top_k": 32, "recent_tokens": 256}' \
  --out "$OUT/decode_eagle3.json" > "$OUT/decode_eagle3.log" 2>&1
echo "eagle3 rc=$?"; python3 -m benchmarks.decode.summarize_decode "$OUT/decode_eagle3.json"
grep -m3 -E "Error|error:" "$OUT/decode_eagle3.log"
