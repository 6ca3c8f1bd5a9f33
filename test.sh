#!/usr/bin/env bash
# Set up (once) and run the whole test suite. Extra arguments go to pytest, e.g. ./test.sh -k topic
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c "import amqp_server, pytest, pika, aio_pika, kombu, hypothesis" 2>/dev/null \
   || [ pyproject.toml -nt .venv/.installed-test ]; then
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[test]'
  touch .venv/.installed-test
fi
exec .venv/bin/python -m pytest -q "$@"
