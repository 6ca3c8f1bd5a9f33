#!/usr/bin/env bash
# Set up (once) and run the whole test suite. Extra arguments go to pytest, e.g. ./test.sh -k topic, or
# ./test.sh -m fast for the fast tier alone (tests/conftest.py says which test is in which tier).
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
FAST_ONLY=0  # the fast tier starts no program: it needs none of the tools below
previous=""
for arg in "$@"; do
  [ "$previous" = -m ] && [ "$arg" = fast ] && FAST_ONLY=1
  previous=$arg
done
# Debian packages some tests drive: Chromium (tests/mgmt/test_ui.py), a JRE (the Spark bridge's SparkSession),
# etcd (tests/cluster/test_cluster.py starts its own), Node.js with npm (tests/clients/test_node_amqplib.py), PHP with
# php-amqplib (tests/clients/test_php_amqplib.py), amqp-tools (rabbitmq-c's command-line client, tests/clients/test_clients.py), Ruby with
# Bunny (tests/clients/test_ruby_bunny.py), iproute2 (tests/cluster/test_nemesis.py puts each node in a network namespace of its
# own). CI runs as root on Debian, so they are installed once when missing.
MISSING=()
[ -x /usr/bin/chromium ] || MISSING+=(chromium)
command -v java >/dev/null 2>&1 || MISSING+=(default-jre-headless)
command -v etcd >/dev/null 2>&1 || MISSING+=(etcd-server)
command -v ip >/dev/null 2>&1 || MISSING+=(iproute2)
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || MISSING+=(nodejs npm)
command -v php >/dev/null 2>&1 && [ -f /usr/share/php/PhpAmqpLib/autoload.php ] || MISSING+=(php-cli php-amqplib)
command -v amqp-publish >/dev/null 2>&1 || MISSING+=(amqp-tools)
command -v ruby >/dev/null 2>&1 && compgen -G "/usr/share/rubygems-integration/all/gems/bunny-*" >/dev/null \
  || MISSING+=(ruby-bunny)
if [ $FAST_ONLY = 0 ] && [ ${#MISSING[@]} -gt 0 ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${MISSING[@]}"; } >/dev/null \
    || echo "test.sh: could not install ${MISSING[*]}; the tests that need them will skip (fail under .ci/run)" >&2
fi
if ! .venv/bin/python -c "import amqp_server, pytest, xdist, pika, aio_pika, kombu, hypothesis, playwright, mypy" 2>/dev/null \
   || [ ! -x .venv/bin/ruff ] || [ pyproject.toml -nt .venv/.installed-test ]; then
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[test]'
  touch .venv/.installed-test
fi
# The Node.js client amqplib, pinned by tests/node/package-lock.json.
if [ $FAST_ONLY = 0 ] && command -v npm >/dev/null 2>&1 && { [ ! -d tests/node/node_modules ] \
     || [ tests/node/package-lock.json -nt tests/node/node_modules/.package-lock.json ]; }; then
  npm ci --prefix tests/node --no-audit --no-fund --loglevel=error >/dev/null \
    || echo "test.sh: npm ci --prefix tests/node failed; tests/clients/test_node_amqplib.py will skip (fail under .ci/run)" >&2
fi
# The static checks pyproject.toml configures (ruff over everything, mypy over the packages and the tests); .ci/run
# asks for them
if [ "${WARREN_CHECKS:-0}" = 1 ]; then
  echo "ruff:" && .venv/bin/ruff check .
  echo "mypy:" && .venv/bin/mypy
fi
# Parallel workers (pytest-xdist): much of the fast tier waits (timers, elections, fsyncs), so two workers per core
# for it; the whole suite in one process unless WARREN_TEST_WORKERS says how many (0: this process, for pdb, -s).
# tests/conftest.py keeps the cluster tier on one worker and starts the long tests first.
WORKERS=${WARREN_TEST_WORKERS:-$(( FAST_ONLY ? 2 * $(nproc) : 0 ))}
exec .venv/bin/python -m pytest -q -n "$WORKERS" --dist loadgroup "$@"
