#!/usr/bin/env bash
# Start a throwaway RabbitMQ on 127.0.0.1:5699 (state in a temp dir), run
# benchmarks/amqp_load.py against it, then stop it and remove the temp dir.
#
#   benchmarks/run_rabbitmq.sh [amqp_load.py args...]
#   e.g. benchmarks/run_rabbitmq.sh --workload all --seconds 5 --runs 1
#
# Environment overrides: BENCH_PORT (5699), BENCH_DIST_PORT (25699),
# BENCH_NODENAME (bench@localhost), PYTHON (.venv/bin/python if present),
# BENCH_LOAD (amqp_load.py; amqp10_load.py measures AMQP 1.0, with the
# rabbitmq_amqp1_0 plugin enabled and 3.x's v1 addresses).
# Needs Debian/Ubuntu's rabbitmq-server package; run as root or as the
# rabbitmq user (the Debian wrappers refuse anybody else).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(dirname "$HERE")"
PORT="${BENCH_PORT:-5699}"
DIST_PORT="${BENCH_DIST_PORT:-25699}"
NODE="${BENCH_NODENAME:-bench@localhost}"
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi

TMP="$(mktemp -d /tmp/warren-rmq-bench.XXXXXX)"
mkdir -p "$TMP/mnesia" "$TMP/log"
if [ "$(id -u)" = 0 ] && id rabbitmq >/dev/null 2>&1; then
    chown -R rabbitmq:rabbitmq "$TMP"   # the Debian wrapper su's to rabbitmq
fi
chmod 755 "$TMP"

export RABBITMQ_NODE_PORT="$PORT"
export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
export RABBITMQ_NODENAME="$NODE"
export RABBITMQ_DIST_PORT="$DIST_PORT"
export RABBITMQ_MNESIA_BASE="$TMP/mnesia"
export RABBITMQ_LOG_BASE="$TMP/log"
export RABBITMQ_ENABLED_PLUGINS_FILE="$TMP/enabled_plugins"
# keep Erlang distribution on loopback too
export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
LOAD="${BENCH_LOAD:-amqp_load.py}"
LOAD_ARGS=()
if [ "$LOAD" = amqp10_load.py ]; then
    echo "[rabbitmq_amqp1_0]." > "$TMP/enabled_plugins"
    LOAD_ARGS=(--addresses v1)
else
    echo "[]." > "$TMP/enabled_plugins"
fi
[ "$(id -u)" = 0 ] && chown rabbitmq:rabbitmq "$TMP/enabled_plugins" 2>/dev/null || true

stop_broker() {
    timeout 30 rabbitmqctl -n "$NODE" stop >/dev/null 2>&1 || true
    rm -rf "$TMP"
}
trap stop_broker EXIT

echo "starting RabbitMQ node $NODE on 127.0.0.1:$PORT (state in $TMP)" >&2
timeout 60 rabbitmq-server -detached
# -detached returns before the node is up: poll (bounded) until it answers
up=0
for _ in $(seq 1 60); do
    if timeout 30 rabbitmqctl -n "$NODE" await_startup >/dev/null 2>&1; then up=1; break; fi
    sleep 1
done
if [ "$up" != 1 ]; then
    echo "RabbitMQ failed to start; log tail:" >&2
    tail -n 30 "$TMP"/log/*.log >&2 2>/dev/null || true
    exit 1
fi

# the node's own process (beam.smp): amqp_load.py reports its CPU time per delivery, as run_warren.sh does Warren's
PID="$(timeout 30 rabbitmqctl -n "$NODE" eval 'list_to_integer(os:getpid()).' 2>/dev/null || true)"
BROKER_PID=()
[[ "$PID" =~ ^[0-9]+$ ]] && BROKER_PID=(--broker-pid "$PID")
"$PYTHON" "$HERE/$LOAD" --host 127.0.0.1 --port "$PORT" "${BROKER_PID[@]}" "${LOAD_ARGS[@]}" "$@"
