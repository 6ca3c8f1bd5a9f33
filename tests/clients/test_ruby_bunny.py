"""The broker through Bunny (Debian's ruby-bunny 2.19, a Ruby client; test.sh installs it with ruby).

tests/ruby/bunny_client.rb does what Bunny's own specs do against a broker: an ack whose tag is not outstanding
(basic_ack_spec), connection recovery after the node closes the connection (connection_recovery_spec), and the
application closing the connection while Bunny recovers it; it prints what it saw as JSON.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, unavailable

RUBY = shutil.which("ruby") or ""  # "" if missing, and then the module is skipped
if not RUBY or not list(Path("/usr/share/rubygems-integration/all/gems").glob("bunny-*")):
    unavailable("ruby and ruby-bunny are not installed (apt-get install ruby-bunny); test.sh installs them")

pytestmark = [pytest.mark.timeout(90), pytest.mark.client]


def test_bunny_ack_error_and_connection_recovery(broker, uid):
    if not broker.mgmt_port:
        pytest.skip("needs the HTTP API (WARREN_TEST_BROKER_MGMT in parity mode)")
    done = subprocess.run([RUBY, str(ROOT / "tests" / "ruby" / "bunny_client.rb"), str(broker.port),
                           str(broker.mgmt_port), uid], capture_output=True, text=True, timeout=75)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    # basic.ack(82, multiple=true) with only tag 1 outstanding: a channel error, as from RabbitMQ
    assert result["ack_error"] == {"code": 406, "text": "PRECONDITION_FAILED - unknown delivery tag 82"}
    assert result["ack_channel_open"] is False
    assert result["recovered"] is True and result["consumer_recovered"] is True
    assert result["left_after_close_during_recovery"] == [0, 0]
