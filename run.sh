#!/usr/bin/env bash
# Set up (once) and run a Warren node: AMQP on 5672, data in ./warren-data. Options pass through
# to warren-server (see `./run.sh --help`), e.g. ./run.sh --amqp-port 5673 --data-dir /tmp/w
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c "import amqp_server, pamqp, lmdb, rich" 2>/dev/null || [ pyproject.toml -nt .venv/.installed ]; then
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e .
  touch .venv/.installed
fi
exec .venv/bin/warren-server "$@"
