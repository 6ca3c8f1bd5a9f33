"""A node against an etcd that checks who writes: etcd's own users (auth enabled, the node with its user and a
password file) and TLS client certificates (etcd's --client-cert-auth).  With the right credentials the node
works; with wrong ones it does not start, and says why."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import aetcd
import grpc
import pytest
from aetcd import rpc
from aetcd.utils import prefix_range_end

from conftest import CLUSTER, ROOT, free_port, starts
from forwarder.metadata.etcd import EtcdClient
from conftest import connect
from test_cluster import SECRET, Etcd, start_node
from test_tls import PKI

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

ROOT_PASSWORD = "root-secret"
NODE_USER, NODE_PASSWORD = "warren", "warren-secret"


async def _enable_auth(port: int) -> None:
    """As ``etcdctl user add root; etcdctl auth enable``, plus a user ``warren`` that may read and write /warren/."""
    client = aetcd.Client(port=port, timeout=5)
    await client.connect()
    try:
        auth = rpc.AuthStub(client.channel)
        for user, password, role in (("root", ROOT_PASSWORD, "root"), (NODE_USER, NODE_PASSWORD, "warren")):
            await auth.UserAdd(rpc.AuthUserAddRequest(name=user, password=password))
            await auth.RoleAdd(rpc.AuthRoleAddRequest(name=role))
            await auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user=user, role=role))
        await auth.RoleGrantPermission(rpc.AuthRoleGrantPermissionRequest(name="warren", perm=rpc.Permission(
            permType=rpc.Permission.READWRITE, key=b"/warren/", range_end=prefix_range_end(b"/warren/"))))
        await auth.AuthEnable(rpc.AuthEnableRequest())
    finally:
        await client.close()


async def _queues_in(port: int, user: str | None = None, password: str | None = None,
                     tls: tuple[str, str, str] | None = None) -> list[str]:
    """The names of the queues etcd holds, read as ``user`` (``tls``: CA, certificate and key files)."""
    credentials = None if tls is None else grpc.ssl_channel_credentials(
        *(Path(path).read_bytes() for path in (tls[0], tls[2], tls[1])))
    client = EtcdClient("127.0.0.1", port, user, password, credentials, timeout=5)
    try:
        return [json.loads(kv.value)["name"] for kv in await client.get_prefix(b"/warren/def/queue/")]
    finally:
        await client.close()


@pytest.fixture
@starts(CLUSTER)
def etcd_with_auth(tmp_path: Path) -> Iterator[Etcd]:
    server = Etcd(tmp_path / "etcd")
    asyncio.run(_enable_auth(server.port))
    yield server
    server.stop()


def refused_start(tmp_path: Path, etcd_port: int, *extra: str) -> str:
    """Start a node that must not start: its exit code is 1, and the log line saying why is returned."""
    data = tmp_path / f"refused-{free_port()}"
    result = subprocess.run(
        [sys.executable, "-m", "amqp_server", "--bind", "127.0.0.1", "--amqp-port", str(free_port()),
         "--mgmt-port", str(free_port()), "--data-dir", str(data), "--node-name", "refused@localhost",
         "--cluster-etcd", f"127.0.0.1:{etcd_port}", "--cluster-secret", SECRET,
         "--cluster-port", str(free_port()), *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env=dict(os.environ, COLUMNS="400"))
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = [line for line in (result.stdout + result.stderr).splitlines() if "cannot start" in line]
    assert len(lines) == 1, result.stdout + result.stderr
    return lines[0]


def password_file(tmp_path: Path, password: str) -> str:
    path = tmp_path / f"etcd-password-{free_port()}"
    path.write_text(password + "\n")
    path.chmod(0o600)
    return str(path)


def test_a_node_logs_in_to_etcd_and_one_with_a_wrong_password_does_not_start(tmp_path: Path,
                                                                           etcd_with_auth: Etcd) -> None:
    port = etcd_with_auth.port
    with pytest.raises(aetcd.exceptions.ClientError):  # auth is on: an anonymous read is refused
        asyncio.run(_queues_in(port))
    node = start_node(tmp_path, etcd_with_auth, 1, extra=(
        "--cluster-etcd-user", NODE_USER, "--cluster-etcd-password-file", password_file(tmp_path, NODE_PASSWORD)))
    try:
        with connect(node) as connection:
            connection.channel().queue_declare("with-auth", durable=True)
        assert asyncio.run(_queues_in(port, "root", ROOT_PASSWORD)) == ["with-auth"]
        etcd_with_auth.kill()  # a restarted etcd has forgotten the node's token: the node logs in again
        etcd_with_auth.start()
        with connect(node) as connection:
            connection.channel().queue_declare("after-restart", durable=True)
        assert sorted(asyncio.run(_queues_in(port, "root", ROOT_PASSWORD))) == ["after-restart", "with-auth"]
    finally:
        node.stop()
    line = refused_start(tmp_path, port, "--cluster-etcd-user", NODE_USER,
                         "--cluster-etcd-password-file", password_file(tmp_path, "wrong"))
    assert f"etcd at 127.0.0.1:{port} refused this node" in line and "authentication failed" in line, line
    line = refused_start(tmp_path, port)  # no login at all
    assert f"etcd at 127.0.0.1:{port} refused this node" in line and "user name is empty" in line, line
    line = refused_start(tmp_path, port, "--cluster-etcd-user", NODE_USER,
                         "--cluster-etcd-password-file", str(tmp_path / "missing"))
    assert "cannot read etcd password file" in line, line


def test_a_node_shows_etcd_its_client_certificate_and_one_without_a_trusted_one_does_not_start(
        tmp_path: Path) -> None:
    pki = PKI.create(tmp_path)
    etcd = Etcd(tmp_path / "etcd", tls=(
        ["--cert-file", pki.server_cert, "--key-file", pki.server_key, "--client-cert-auth",
         "--trusted-ca-file", pki.cafile], pki.client_context("health")))
    try:
        cert, key = pki.issue("warren-node")
        node = start_node(tmp_path, etcd, 1, extra=(
            "--cluster-etcd-cacert", pki.cafile, "--cluster-etcd-cert", cert, "--cluster-etcd-key", key))
        try:
            with connect(node) as connection:
                connection.channel().queue_declare("with-tls", durable=True)
            assert asyncio.run(_queues_in(etcd.port, tls=(pki.cafile, cert, key))) == ["with-tls"]
        finally:
            node.stop()
        other = tmp_path / "other"
        other.mkdir()
        stranger = PKI.create(other).issue("stranger")
        line = refused_start(tmp_path, etcd.port, "--cluster-etcd-cacert", pki.cafile,
                             "--cluster-etcd-cert", stranger[0], "--cluster-etcd-key", stranger[1])
        assert f"etcd at 127.0.0.1:{etcd.port} refused this node" in line, line
        line = refused_start(tmp_path, etcd.port, "--cluster-etcd-cacert", pki.cafile)  # no certificate
        assert f"etcd at 127.0.0.1:{etcd.port} refused this node" in line, line
        line = refused_start(tmp_path, etcd.port, "--cluster-etcd-cert", cert)
        assert "--cluster-etcd-cert and --cluster-etcd-key go together" in line, line
    finally:
        etcd.stop()
