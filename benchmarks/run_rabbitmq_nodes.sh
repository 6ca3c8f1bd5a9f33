#!/usr/bin/env bash
# Standalone (unclustered) throwaway RabbitMQ 3.10 nodes with the shovel, federation and management plugins, for the
# shovel benchmark (benchmarks/shovel.py) and the migration guide's rehearsal (docs/operations.md, "Moving from
# RabbitMQ", "Federation").
#   benchmarks/run_rabbitmq_nodes.sh start [COUNT]  shovelrmq{1..COUNT}@localhost: AMQP 127.0.0.1:5790+n,
#                                                   management 15790+n (guest/guest), state under $RMQ_NODES_DIR
#   benchmarks/run_rabbitmq_nodes.sh kill N         kill -9 node N's VM
#   benchmarks/run_rabbitmq_nodes.sh pid N          the OS pid of node N's VM (its CPU time, for the benchmark)
#   benchmarks/run_rabbitmq_nodes.sh stop           stop every node started and remove their state
# Needs Debian's rabbitmq-server package; run as root (the Debian wrappers switch to the rabbitmq user).
set -u
C=${RMQ_NODES_DIR:-/tmp/warren-rmq-nodes}
export ERL_EPMD_ADDRESS=127.0.0.1
export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
node_env() {
  export RABBITMQ_NODENAME=shovelrmq$1@localhost RABBITMQ_DIST_PORT=$((25790 + $1))
  export RABBITMQ_CONFIG_FILE=$C/n$1/rabbitmq.conf RABBITMQ_ENABLED_PLUGINS_FILE=$C/n$1/enabled_plugins
  export RABBITMQ_MNESIA_BASE=$C/n$1/mnesia RABBITMQ_LOG_BASE=$C/n$1/log
}
ctl() { local n=$1; shift; timeout 60 rabbitmqctl -n "shovelrmq$n@localhost" "$@"; }
case "${1:-}" in
  start)
    count=${2:-1}
    rm -rf "$C"; mkdir -p "$C"; chmod 755 "$C"
    for n in $(seq 1 "$count"); do
      mkdir -p "$C/n$n/mnesia" "$C/n$n/log"
      printf 'listeners.tcp.default = 127.0.0.1:%s\nmanagement.tcp.ip = 127.0.0.1\nmanagement.tcp.port = %s\n' \
        $((5790 + n)) $((15790 + n)) > "$C/n$n/rabbitmq.conf"
      echo '[rabbitmq_management,rabbitmq_shovel,rabbitmq_shovel_management,rabbitmq_federation,rabbitmq_federation_management].' \
        > "$C/n$n/enabled_plugins"
    done
    chown -R rabbitmq:rabbitmq "$C"
    for n in $(seq 1 "$count"); do
      ( node_env "$n"; timeout 60 rabbitmq-server -detached )
      ok=0
      for _ in $(seq 1 60); do ctl "$n" await_startup >/dev/null 2>&1 && { ok=1; break; }; sleep 2; done
      [ "$ok" = 1 ] || { echo "shovelrmq$n did not start (log: $C/n$n/log)"; exit 1; }
    done
    echo "$count node(s) up: AMQP from 5791, management from 15791 (guest/guest)" ;;
  kill) kill -9 "$(ctl "$2" eval 'os:getpid().' 2>/dev/null | tr -d '"')" && echo "shovelrmq$2 killed" ;;
  pid) ctl "$2" eval 'os:getpid().' 2>/dev/null | tr -d '"' ;;
  stop) for d in "$C"/n*; do [ -d "$d" ] && ctl "${d##*/n}" stop >/dev/null 2>&1; done; rm -rf "$C"; echo stopped ;;
  *) sed -n 2,9p "$0"; exit 2 ;;
esac
