#!/usr/bin/env bash
# Set up (once) and run the whole test suite. Extra arguments go to pytest, e.g. ./test.sh -k topic
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# tests/test_ui.py drives Debian's Chromium; CI runs as root on Debian, so install it once if missing
if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null \
    || echo "test.sh: could not install chromium; the web UI tests will be skipped" >&2
fi
if ! .venv/bin/python -c "import amqp_server, pytest, pika, aio_pika, kombu, hypothesis, playwright" 2>/dev/null \
   || [ pyproject.toml -nt .venv/.installed-test ]; then
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[test]'
  touch .venv/.installed-test
fi
exec .venv/bin/python -m pytest -q "$@"
