#!/usr/bin/env bash
# Run widely used clients' own integration suites (from their PyPI sdists) against a running broker, to
# compare pass counts with RabbitMQ's. Not part of ./test.sh: it needs PyPI and a broker you started.
#   tests/client_suites/run.sh AMQP_PORT MGMT_PORT [STREAM_PORT]   e.g. 5672 15672 5552 (guest/guest on 127.0.0.1)
# Prints each suite's summary line; logs stay in $WORK (default /tmp/warren-client-suites).
# pika's acceptance tests are not in its sdist: they come from Debian's source package (apt-get source).
# rstream's tests are not in its sdist either, nor in any registry: RSTREAM_TESTS=DIR names a copy of the
# tests/ folder of its repository. They reach the broker at localhost:5552 and its HTTP API at
# localhost:15672 whatever they are told, so they run only with STREAM_PORT 5552 and MGMT_PORT 15672,
# the broker advertising localhost (Warren: --stream-advertised-host localhost).
set -euo pipefail
AMQP_PORT=$1 MGMT_PORT=$2 STREAM_PORT=${3:-}
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
fetch celery 5.7.0 celery-5.7.0
if [ ! -d pika-1.3.2 ]; then  # Debian trixie's python-pika 1.3.2-1, through a source list of our own
  mkdir -p apt/lists/partial
  sed -n 's/^URIs: *\(.*\)/deb-src \1 trixie main/p' /etc/apt/sources.list.d/debian.sources | head -1 > apt/src.list
  APT=(-o Dir::Etc::SourceList="$WORK/apt/src.list" -o Dir::Etc::SourceParts=/nonexistent
       -o Dir::State::Lists="$WORK/apt/lists")
  apt-get "${APT[@]}" update -qq
  # the mirror may lack the .dsc: the upstream tarball (with tests/) is what is needed
  (cd apt && apt-get "${APT[@]}" source --download-only -qq python-pika=1.3.2-1) ||
    [ -f apt/python-pika_1.3.2.orig.tar.gz ]
  tar xzf apt/python-pika_1.3.2.orig.tar.gz
  # the suite's broker is localhost:5672: take the port from PIKA_TEST_PORT instead
  sed -i "s/{'port': 5672}/{'port': int(__import__('os').environ['PIKA_TEST_PORT'])}/" \
    pika-1.3.2/tests/acceptance/blocking_adapter_test.py
  sed -i "s/host='localhost', port=5672)/host='localhost', port=int(os.environ['PIKA_TEST_PORT']))/" \
    pika-1.3.2/tests/base/async_test_base.py
fi
if [ ! -x venv/bin/pytest ]; then
  python3 -m venv venv && venv/bin/pip install -q aio-pika==10.2.1 aiormq==7.2.4 amqp==5.4.2 kombu==5.7.0 \
    aiomisc aiomisc-pytest pytest pytest-timeout shortuuid timeout-decorator yarl
  python3 -m venv venv-storm && venv-storm/bin/pip install -q "pamqp>=3.2,<4" requests mock pytest pytest-timeout
  python3 -m venv venv-pika && venv-pika/bin/pip install -q pytest pytest-timeout tornado twisted gevent
  python3 -m venv venv-rstream && venv-rstream/bin/pip install -q rstream==1.1.1 pytest pytest-asyncio \
    pytest-timeout pytest-rerunfailures requests
  python3 -m venv venv-celery && venv-celery/bin/pip install -q celery==5.7.0 pytest pytest-celery \
    pytest-rerunfailures pytest-subtests pytest-timeout pytest-order redis msgpack pyyaml freezegun pydantic \
    django
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
  (cd "$dir" && timeout 1800 "$@" -p no:cacheprovider -q --timeout="${TEST_TIMEOUT:-60}" > "$WORK/$label.log" 2>&1) ||
    true
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
# pika's own sources (tests/ imports pika from the source tree); the kqueue variants skip on Linux
PIKA_TEST_PORT=$AMQP_PORT run pika pika-1.3.2 ../venv-pika/bin/python -m pytest \
  tests/acceptance/async_adapter_tests.py tests/acceptance/blocking_adapter_test.py
# Celery with RabbitMQ's setup in its CI: py-amqp broker, rpc result backend (no redis: its files left out);
# the worker tests start the `celery` command
PATH="$WORK/venv-celery/bin:$PATH" TEST_BROKER="pyamqp://guest:guest@127.0.0.1:$AMQP_PORT//" TEST_BACKEND=rpc \
  TEST_TIMEOUT=120 run celery celery-5.7.0 ../venv-celery/bin/python -m pytest t/integration/test_tasks.py \
  t/integration/test_canvas.py t/integration/test_inspect.py t/integration/test_worker.py \
  t/integration/test_serialization.py t/integration/test_group_chains.py t/integration/test_loader.py t/integration/test_connection_recovery.py
if [ -n "${RSTREAM_TESTS:-}" ] && [ "$STREAM_PORT" = 5552 ] && [ "$MGMT_PORT" = 15672 ]; then
  rm -rf rstream-tests && mkdir rstream-tests && cp -r "$RSTREAM_TESTS" rstream-tests/tests
  # left out: test_cluster (three nodes), the validate_id files (they need rstream's unreleased API) and
  # the client pool's unit tests (no broker)
  run rstream rstream-tests ../venv-rstream/bin/python -m pytest tests --ignore=tests/test_cluster.py \
    --ignore=tests/test_validate_id.py --ignore=tests/test_consumer_validate_id.py -k "not client_pool"
else
  printf '%-10s %s\n' rstream "skipped: needs RSTREAM_TESTS, STREAM_PORT 5552 and MGMT_PORT 15672"
fi
