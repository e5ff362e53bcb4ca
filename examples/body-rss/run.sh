#!/bin/sh
# Peak RSS of `kvgate serve` under N concurrent large request bodies (docs/security.md, "Request
# bodies"). Starts an external `kvgate sim` and `kvgate serve` on loopback, sends N bodies of
# SIZE_MB at once with curl, and prints the gateway's VmHWM and each answer's status.
#
#   examples/body-rss/run.sh KVGATE_BINARY [N] [SIZE_MB] [serve flags...]
#
# e.g. run.sh ./kvgate 8 100 --max-payload-size 134217728 --body-memory-budget 536870912
set -eu
bin=$1; n=${2:-8}; size=${3:-100}; shift 3 || shift $#
dir=$(mktemp -d)
trap 'kill $simpid $gwpid 2>/dev/null || true; rm -rf "$dir"' EXIT
"$bin" sim --host 127.0.0.1 --base-port 0 --count 1 >"$dir/sim.out" 2>"$dir/sim.err" &
simpid=$!
for _ in $(seq 100); do grep -q http "$dir/sim.out" 2>/dev/null && break; sleep 0.1; done
sim=$(head -1 "$dir/sim.out")
"$bin" serve --host 127.0.0.1 --port 0 --prometheus-port 0 --admin-port -1 --policy round_robin \
	--disable-load-monitor --worker-urls "$sim" "$@" 2>"$dir/gw.err" &
gwpid=$!
for _ in $(seq 100); do grep -q 'api=http' "$dir/gw.err" 2>/dev/null && break; sleep 0.1; done
api=$(sed -n 's/.*api=\(http:\/\/[^ ]*\).*/\1/p' "$dir/gw.err" | head -1)
# One body of SIZE_MB: a chat request whose prompt is SIZE_MB of 'a'.
python3 - "$size" >"$dir/body.json" <<'PY'
import sys
n = int(sys.argv[1]) << 20
pre = '{"model":"kvgate-sim","max_tokens":4,"messages":[{"role":"user","content":"'
post = '"}]}'
sys.stdout.write(pre + 'a' * (n - len(pre) - len(post)) + post)
PY
echo "baseline VmHWM: $(grep VmHWM /proc/$gwpid/status)"
curls=
for i in $(seq "$n"); do
	curl -s -o /dev/null -w "body $i: %{http_code}\n" -H 'Content-Type: application/json' \
		--data-binary @"$dir/body.json" --max-time 120 "$api/v1/chat/completions" &
	curls="$curls $!"
done
for p in $curls; do wait "$p" || true; done
echo "after $n x $size MB: $(grep VmHWM /proc/$gwpid/status)"
