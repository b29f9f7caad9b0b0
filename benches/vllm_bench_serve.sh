#!/usr/bin/env bash
# vLLM's own benchmark client against `pagedrs serve` on a loopback port: random
# prompts of 128 tokens, 64 output tokens (ignore_eos), at 4 and 2 req/s and all at once.
#   VLLM=/path/to/venv/bin/vllm bash benches/vllm_bench_serve.sh [pagedrs serve flags...]
# vLLM goes in its own venv (`python -m venv V && V/bin/pip install vllm`).
set -euo pipefail
VLLM=${VLLM:-vllm}
PORT=${PORT:-8471}
cd "$(dirname "$0")/.."
TOK=$(python -c "from pagedrs.executor.model_loader import resolve_model; print(resolve_model('smollm2-135m-instruct')[0])")
pagedrs serve smollm2-135m-instruct --port "$PORT" --max-model-len 1024 --log-level warning \
  --max-waiting-requests 100000 "$@" &
SRV=$!
trap 'kill $SRV; wait $SRV' EXIT
until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do sleep 1; done
for spec in "4 48" "2 32" "inf 48"; do
  read -r rate num <<<"$spec"
  "$VLLM" bench serve --backend openai-chat --base-url "http://127.0.0.1:$PORT" \
    --endpoint /v1/chat/completions --model smollm2-135m-instruct --tokenizer "$TOK" \
    --dataset-name random --random-input-len 128 --random-output-len 64 --ignore-eos \
    --request-rate "$rate" --num-prompts "$num" --seed 0 2>&1 |
    grep -E "Successful|Benchmark duration|Output token throughput|TTFT|TPOT" | sed "s/^/rate $rate: /"
done
