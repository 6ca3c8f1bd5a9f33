#!/usr/bin/env bash
# Start a throwaway Warren node on 127.0.0.1:5698 (data in a temp dir), run
# benchmarks/amqp_load.py against it, then stop it and remove the temp dir.
#
#   benchmarks/run_warren.sh [amqp_load.py args...]
#   e.g. benchmarks/run_warren.sh --workload all --seconds 5 --runs 3
# BENCH_TLS=1 measures over AMQPS instead: a throwaway CA and server certificate (openssl) in the temp dir,
# the node's TLS listener on BENCH_TLS_PORT (5697), the load generator verifying it with --tls-ca.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(dirname "$HERE")"
PORT="${BENCH_PORT:-5698}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
TMP="$(mktemp -d /tmp/warren-bench.XXXXXX)"
NODE_TLS=()
LOAD_TO=(--port "$PORT")
if [ "${BENCH_TLS:-0}" = 1 ]; then
    TLS_PORT="${BENCH_TLS_PORT:-5697}"
    EC=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
    openssl req -x509 "${EC[@]}" -keyout "$TMP/ca.key" -out "$TMP/ca.pem" -days 1 -subj "/CN=warren-bench CA" 2>/dev/null
    openssl req "${EC[@]}" -keyout "$TMP/server.key" -out "$TMP/server.csr" -subj "/CN=localhost" 2>/dev/null
    printf "subjectAltName=IP:127.0.0.1,DNS:localhost\n" > "$TMP/san.ext"
    openssl x509 -req -in "$TMP/server.csr" -CA "$TMP/ca.pem" -CAkey "$TMP/ca.key" -CAcreateserial -days 1 \
        -extfile "$TMP/san.ext" -out "$TMP/server.pem" 2>/dev/null
    NODE_TLS=(--tls-port "$TLS_PORT" --tls-certfile "$TMP/server.pem" --tls-keyfile "$TMP/server.key")
    LOAD_TO=(--port "$TLS_PORT" --tls-ca "$TMP/ca.pem")
fi
# shellcheck disable=SC2086  # BROKER_ARGS: extra broker options, split on spaces (e.g. "--queue-window 100000")
"$PYTHON" -m amqp_server --bind 127.0.0.1 --amqp-port "$PORT" --data-dir "$TMP/data" --mgmt-enabled false --log-level WARNING \
    "${NODE_TLS[@]}" ${BROKER_ARGS:-} > "$TMP/broker.log" 2>&1 &
PID=$!
cleanup() { kill -TERM "$PID" 2>/dev/null; wait "$PID" 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT
for _ in $(seq 100); do
    (echo > "/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
    sleep 0.1
done
cd "$ROOT"
"$PYTHON" benchmarks/amqp_load.py --host 127.0.0.1 "${LOAD_TO[@]}" --broker-pid "$PID" "$@"
