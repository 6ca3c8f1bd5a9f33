#!/usr/bin/env bash
# Start a throwaway Warren node on 127.0.0.1:5698 (data in a temp dir), run
# benchmarks/amqp_load.py against it, then stop it and remove the temp dir.
#
#   benchmarks/run_warren.sh [amqp_load.py args...]
#   e.g. benchmarks/run_warren.sh --workload all --seconds 5 --runs 3
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(dirname "$HERE")"
PORT="${BENCH_PORT:-5698}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
TMP="$(mktemp -d /tmp/warren-bench.XXXXXX)"
"$PYTHON" -m amqp_server --bind 127.0.0.1 --amqp-port "$PORT" --data-dir "$TMP/data" --mgmt-enabled false --log-level WARNING \
    > "$TMP/broker.log" 2>&1 &
PID=$!
cleanup() { kill -TERM "$PID" 2>/dev/null; wait "$PID" 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT
for _ in $(seq 100); do
    (echo > "/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
    sleep 0.1
done
cd "$ROOT"
"$PYTHON" benchmarks/amqp_load.py --host 127.0.0.1 --port "$PORT" "$@"
