#!/usr/bin/env bash
# What a gateway measures of its engines' speed after 30 s of load (docs/benchmarks.md, "Engine
# rates"): two engines of KIND behind one `kvgate serve` with audit headers, 30 s of the
# long-context workload at RATE requests/s, then each worker's prefill_rate in /get_loads (the
# engines' counters, μp) and the cost terms of one audited request (mu=, d=).
#
#   examples/engine-rates/run.sh KVGATE_BINARY KIND [RATE] [serve flags...]
#
# KIND is sglang or vllm (`kvgate sim` at 4,000 prefill tokens/s) or llmd (llm-d-inference-sim
# at 1 ms a prompt token, 8 slots: the binary named by $LLMD_SIM, default llm-d-inference-sim on
# $PATH). Everything listens on loopback ports 32100-32201.
set -u
bin=$1; kind=$2; rate=${3:-3}; shift 2; shift $(( $# > 0 ? 1 : 0 ))
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null' EXIT
urls="http://127.0.0.1:32100,http://127.0.0.1:32101"
case $kind in
sglang | vllm)
	"$bin" sim --count 2 --base-port 32100 --flavor "$kind" --prefill-tps 4000 --model m >/dev/null 2>&1 &
	pids+=($!); truth=4000 ;;
llmd)
	for p in 32100 32101; do
		POD_IP=127.0.0.1 "${LLMD_SIM:-llm-d-inference-sim}" --port $p --model m --force-dummy-tokenizer \
			--mode random --max-num-seqs 8 --max-model-len 32768 --latency-calculator per-token \
			--prefill-overhead 10ms --prefill-time-per-token 1ms --inter-token-latency 5ms \
			--zmq-endpoint "" >/dev/null 2>&1 &
		pids+=($!)
	done
	truth=1000 ;;
*) echo "KIND must be sglang, vllm or llmd" >&2; exit 2 ;;
esac
for _ in $(seq 50); do curl -s -m1 -o /dev/null http://127.0.0.1:32101/health && break; sleep 0.2; done
"$bin" serve --host 127.0.0.1 --port 32200 --admin-port 32201 --prometheus-port 0 --admin-key adm \
	--audit-headers --worker-urls "$urls" "$@" >/dev/null 2>&1 &
pids+=($!)
for _ in $(seq 50); do curl -s -m1 -o /dev/null http://127.0.0.1:32200/health && break; sleep 0.2; done
load() {
	"$bin" bench --target http://127.0.0.1:32200 --workload long-context --prefixes 200 \
		--prefix-words 1500 --rate "$rate" --duration "$1" --warmup 0s --no-progress >/dev/null 2>&1
}
load 30s
echo "$kind: true prefill rate $truth tokens/s, $rate requests/s"
curl -s -H 'Authorization: Bearer adm' http://127.0.0.1:32201/get_loads | python3 -c '
import json, sys
for w in json.load(sys.stdin)["workers"]:
    r = w.get("entry", {}).get("report", {})
    print(" ", w["url"], "prefill_rate", round(r.get("prefill_rate", 0)), "running", r.get("num_running_reqs"))'
load 4s &
loadpid=$!
sleep 1
prompt=$(python3 -c "print('word ' * 3000)")
curl -s -D - -o /dev/null -H 'Authorization: Bearer adm' -H 'Content-Type: application/json' \
	-d "{\"model\":\"m\",\"prompt\":\"$prompt\",\"max_tokens\":4}" http://127.0.0.1:32200/v1/completions |
	grep -i '^x-kvgate-cost:' | sed 's/^/  /'
wait "$loadpid"
