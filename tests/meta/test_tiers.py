"""The tier rule of conftest.py, on a suite of its own run by pytest in a subprocess: a test's tier is read
from the fixtures it uses and its marks, `-m TIER` runs one tier, the whole suite runs the fast tier first, and
a fast test that starts a program fails."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

SUITE = '''
import subprocess
import sys

import pytest

from conftest import CLUSTER, starts


@pytest.fixture
def broker():  # an in-process stand-in overrides the node of the same name, as tests/core/test_core.py's does
    return "in-process"


@pytest.fixture
@starts(CLUSTER)
def etcd():
    return "etcd"


@pytest.fixture
def cluster(etcd):  # built on a fixture that starts something: a cluster test too
    return etcd


def test_a_node(start_broker):
    pass


def test_in_process(broker):
    pass


def test_a_cluster(cluster):
    pass


@pytest.mark.client
def test_a_client_of_its_own():
    subprocess.run(["true"], check=True)


def test_starts_its_own_helper():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_starts_a_program():
    subprocess.run(["true"], check=True)


def test_starts_a_node():
    subprocess.run([sys.executable, "-m", "amqp_server", "--help"], capture_output=True)
'''


def run_pytest(where: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args], cwd=where,
                          capture_output=True, text=True, timeout=120)
    return done.stdout + done.stderr


@pytest.mark.long
@pytest.mark.timeout(600)  # pytest started many times over, each bounded below
def test_tiers_come_from_fixtures_and_marks_and_fast_tests_start_no_program(tmp_path):
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_suite.py").write_text(SUITE)

    def collected(*args: str) -> list[str]:
        out = run_pytest(tmp_path, "--collect-only", *args)
        return [line.split("::")[1] for line in out.splitlines() if "::" in line]

    assert collected("-m", "fast") == ["test_in_process", "test_starts_its_own_helper", "test_starts_a_program",
                                       "test_starts_a_node"]
    assert collected("-m", "integration") == ["test_a_node"]
    assert collected("-m", "client") == ["test_a_client_of_its_own"]
    assert collected("-m", "cluster") == ["test_a_cluster"]
    assert collected() == ["test_in_process", "test_starts_its_own_helper", "test_starts_a_program",
                           "test_starts_a_node", "test_a_node", "test_a_client_of_its_own", "test_a_cluster"]

    out = run_pytest(tmp_path, "-k", "starts or own")
    assert "2 failed, 2 passed" in out, out
    assert re.search(r"_ test_starts_a_program _+\na fast test started 'true': mark the test, or decorate", out)
    assert re.search(rf"_ test_starts_a_node _+\na fast test started '{re.escape(sys.executable)} -m amqp_server", out)
