"""The broker through php-amqplib (a pure-PHP client, Debian's php-amqplib; test.sh installs it with php-cli).

tests/php/round_trip.php publishes with confirms and a mandatory return, consumes with prefetch and acks,
and hits a 404 on one channel; it prints what it saw as JSON.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, unavailable

PHP = shutil.which("php") or ""  # "" if missing, and then the module is skipped
if not PHP or not Path("/usr/share/php/PhpAmqpLib/autoload.php").exists():
    unavailable("php-cli and php-amqplib are not installed (apt-get install php-cli php-amqplib); "
                "test.sh installs them")

pytestmark = [pytest.mark.timeout(60), pytest.mark.client]


def test_php_amqplib_confirm_consume_return_and_channel_error(broker, uid):
    done = subprocess.run([PHP, str(ROOT / "tests" / "php" / "round_trip.php"), str(broker.port), uid],
                          capture_output=True, text=True, timeout=45)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    # every publish confirmed, the unroutable one too (the client lists a multiple ack in its own order)
    assert sorted(result["acked"]) == sorted([f"php {i}" for i in range(20)] + ["lost"])
    assert result["returned"] == [{"code": 312, "text": "NO_ROUTE", "key": f"{uid}.nowhere", "body": "lost"}]
    assert [m["body"] for m in result["received"]] == [f"php {i}" for i in range(20)]
    first = result["received"][0]
    assert (first["i"], first["tags"], first["nested"]) == (0, ["a", "b"], {"k": "v"})
    assert first["persistent"] and first["content_type"] == "text/plain"
    assert result["error"] == {"code": 404, "message": f"NOT_FOUND - no queue '{uid}.missing' in vhost '/'"}
    assert result["left"] == 0
    assert result["connected"] is True
