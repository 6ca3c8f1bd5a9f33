#!/usr/bin/env bash
# Run widely used clients' own integration suites (from their PyPI sdists) against a running broker, to
# compare pass counts with RabbitMQ's. Not part of ./test.sh: it needs PyPI and a broker you started.
#   tests/client_suites/run.sh AMQP_PORT MGMT_PORT        e.g. 5672 15672 (guest/guest on 127.0.0.1)
# Prints each suite's summary line; logs stay in $WORK (default /tmp/warren-client-suites).
set -euo pipefail
AMQP_PORT=$1 MGMT_PORT=$2
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=${WORK:-/tmp/warren-client-suites}
mkdir -p "$WORK" && cd "$WORK"
fetch() {  # name version -> unpacked sdist directory
  [ -d "$3" ] && return
  url=$(curl -sf "https://pypi.org/pypi/$1/json" | python3 -c "
import json, sys, urllib.parse
files = json.load(sys.stdin)['releases']['$2']
print(urllib.parse.urljoin('https://pypi.org/pypi/$1/json', next(f['url'] for f in files if f['packagetype'] == 'sdist')))")
  curl -sfL "$url" | tar xz
}
fetch aio-pika 10.2.1 aio_pika-10.2.1
fetch aiormq 7.2.4 aiormq-7.2.4
fetch amqp 5.4.2 amqp-5.4.2
fetch kombu 5.7.0 kombu-5.7.0
fetch amqpstorm 3.1.4 amqpstorm-3.1.4
if [ ! -x venv/bin/pytest ]; then
  python3 -m venv venv && venv/bin/pip install -q aio-pika==10.2.1 aiormq==7.2.4 amqp==5.4.2 kombu==5.7.0 \
    aiomisc aiomisc-pytest pytest pytest-timeout shortuuid timeout-decorator yarl
  python3 -m venv venv-storm && venv-storm/bin/pip install -q "pamqp>=3.2,<4" requests mock pytest pytest-timeout
  # the asyncio suites start a docker container: the shim gives them the broker under test instead
  for conftest in aio_pika-10.2.1/tests/conftest.py aiormq-7.2.4/tests/conftest.py; do
    sed -i '1i from shim import rabbitmq_container, amqp_direct_url  # noqa' "$conftest"
  done
  python3 - <<'PY'
p = "aio_pika-10.2.1/tests/conftest.py"
s = open(p).read()
s = s.replace("        _docker_host_info = check_docker_available()", "        return")
for name in ("rabbitmq_container(docker)", "amqp_direct_url("):
    s = s.replace(f"def {name}", f"def _docker_{name}")
open(p, "w").write(s)
PY
fi
export PYTHONPATH=$HERE BROKER=127.0.0.1:$AMQP_PORT RABBITMQ_HOST=127.0.0.1 RABBITMQ_5672_TCP=$AMQP_PORT
run() {  # label dir pytest-args...
  local label=$1 dir=$2; shift 2
  (cd "$dir" && timeout 1800 "$@" -p no:cacheprovider -q --timeout=60 > "$WORK/$label.log" 2>&1) || true
  printf '%-10s %s\n' "$label" "$(tail -1 "$WORK/$label.log")"
}
# TLS variants need certificates configured on the broker: left out for both brokers alike
run aio-pika aio_pika-10.2.1 ../venv/bin/python -m pytest tests -k "not amqps and not proxy"
run aiormq aiormq-7.2.4 ../venv/bin/python -m pytest tests -k "not amqps"
run py-amqp amqp-5.4.2 ../venv/bin/python -m pytest t/integration/test_rmq.py -k "not tls" -p no:rerunfailures
run kombu kombu-5.7.0 ../venv/bin/python -m pytest t/integration/test_py_amqp.py -p no:rerunfailures
"$WORK/venv/bin/python" "$HERE/port_proxy.py" 127.0.0.2 5672 "$AMQP_PORT" & PROXY=$!
trap 'kill $PROXY' EXIT
AMQP_HOST=127.0.0.2 AMQP_USERNAME=guest AMQP_PASSWORD=guest AMQP_URI="amqp://guest:guest@127.0.0.2:5672/%2F" \
  AMQP_HTTP_URL="http://127.0.0.1:$MGMT_PORT" \
  run amqpstorm amqpstorm-3.1.4 ../venv-storm/bin/python -m pytest amqpstorm/tests/functional \
  --ignore=amqpstorm/tests/functional/ssl
