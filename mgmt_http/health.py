"""Health checks, RabbitMQ 3.10's: /api/healthchecks/node and the /api/health/checks/* family.

Each answers ``{"status": "ok", ...}`` with 200, or ``{"status": "failed", "reason": ...}`` with 503,
in RabbitMQ's JSON, so that orchestration probes written for RabbitMQ read Warren the same way.
"""
from __future__ import annotations

import datetime
import ssl
from typing import Any

from aiohttp import web

from amqp_server.publisher_flow import DISK, MEMORY

from .context import Context, ctx
from .http import bad_request, json_response

routes = web.RouteTableDef()

PROTOCOL_ALIASES = {"amqp091": "amqp", "amqp0.9.1": "amqp", "amqp0-9-1": "amqp", "amqps": "amqp/ssl",
                    "amqp091/ssl": "amqp/ssl"}
UNIT_DAYS = {"days": 1, "weeks": 7, "months": 30, "years": 365}


def _ok(**extra: Any) -> web.Response:
    return json_response({"status": "ok", **extra})


def _failed(reason: str, **extra: Any) -> web.Response:
    return json_response({"status": "failed", "reason": reason, **extra}, 503)


@routes.get("/api/healthchecks/node")
@routes.get("/api/healthchecks/node/{node}")
async def node(request: web.Request) -> web.Response:
    """Deprecated in RabbitMQ 3.10 and kept answering ok while the node serves."""
    return _ok()


def _alarms(context: Context) -> list[dict[str, str]]:
    return [{"node": context.node, "resource": resource} for resource in (MEMORY, DISK)
            if context.flow.alarmed(resource)]


@routes.get("/api/health/checks/alarms")
async def alarms(request: web.Request) -> web.Response:
    """This node's alarms and those the other nodes of its cluster last told it of."""
    context = ctx(request)
    cluster = context.broker.cluster
    found = _alarms(context) + ([{"node": name, "resource": resource} for name, peer in sorted(cluster.peers.items())
                                 for resource in (MEMORY, DISK) if resource in peer.alarms]
                                if cluster is not None else [])
    return _failed("There are alarms in effect in the cluster", alarms=found) if found else _ok()


@routes.get("/api/health/checks/local-alarms")
async def local_alarms(request: web.Request) -> web.Response:
    found = _alarms(ctx(request))
    return _failed("There are alarms in effect on the node", alarms=found) if found else _ok()


def listeners(context: Context) -> list[tuple[str, int]]:
    """(protocol, port) of every listener this node serves, RabbitMQ's protocol names."""
    config = context.config
    found = [("amqp", config.amqp_port)]
    if config.tls_certfile:
        found.append(("amqp/ssl", config.tls_port))
    if config.mgmt_enabled:
        found.append(("http", config.mgmt_port))
        if config.mgmt_tls:
            found.append(("https", config.mgmt_tls_port))
    if config.cluster_etcd:
        found.append(("clustering", config.cluster_port or config.amqp_port + 20000))
    if config.stream_enabled:
        found.append(("stream", config.stream_port))
    return found


@routes.get("/api/health/checks/port-listener/{port}")
async def port_listener(request: web.Request) -> web.Response:
    try:
        port = int(request.match_info["port"])
    except ValueError:
        raise bad_request("Invalid port") from None
    ports = sorted(port for _, port in listeners(ctx(request)))
    if port in ports:
        return _ok(port=port)
    return _failed("No active listener", missing=port, ports=ports)


@routes.get("/api/health/checks/protocol-listener/{protocol}")
async def protocol_listener(request: web.Request) -> web.Response:
    asked = request.match_info["protocol"].lower()
    protocol = PROTOCOL_ALIASES.get(asked, asked)
    protocols = [name for name, _ in listeners(ctx(request))]
    if protocol in protocols:
        return _ok(protocol=protocol)
    return _failed("No active listener", missing=asked, protocols=protocols)


@routes.get("/api/health/checks/virtual-hosts")
async def virtual_hosts(request: web.Request) -> web.Response:
    """A vhost of Warren is down only when it does not exist, so every listed one is up."""
    return _ok()


@routes.get("/api/health/checks/node-is-quorum-critical")
async def quorum_critical(request: web.Request) -> web.Response:
    """503 listing the quorum queues this node's shutdown would leave without a majority of running members (an
    operator asks before a rolling restart), in RabbitMQ 3.10's JSON."""
    cluster = ctx(request).broker.cluster
    if cluster is None or not cluster.nodes():
        return _ok(reason="single node cluster")
    queues = [{"readable_name": f"queue '{name}' in vhost '{vhost}'", "name": name, "virtual_host": vhost,
               "type": "quorum"} for vhost, name in cluster.quorum.critical()]
    if queues:
        return _failed("There are quorum queues that would lose their quorum if the target node is shut down",
                       queues=queues)
    return _ok()


@routes.get("/api/health/checks/node-is-mirror-sync-critical")
async def mirror_sync_critical(request: web.Request) -> web.Response:
    """Warren has no mirrored classic queues: none depends on this node for a synchronised mirror."""
    cluster = ctx(request).broker.cluster
    if cluster is None or not cluster.nodes():
        return _ok(reason="single node cluster")
    return _ok()


@routes.get("/api/health/checks/certificate-expiration/{within}/{unit}")
async def certificate_expiration(request: web.Request) -> web.Response:
    """Listeners whose certificate expires within the period (RabbitMQ's units: days, weeks, months, years)."""
    unit = request.match_info["unit"]
    if unit not in UNIT_DAYS:
        raise bad_request("Time unit not recognised. Supported units: days, weeks, months, years.")
    try:
        within = int(request.match_info["within"])
    except ValueError:
        raise bad_request("Period is not valid") from None
    context = ctx(request)
    config = context.config
    deadline = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=within * UNIT_DAYS[unit])
    expiring = []
    for protocol, port in listeners(context):
        certfile = {"amqp/ssl": config.tls_certfile,
                    "https": config.mgmt_tls_certfile or config.tls_certfile}.get(protocol)
        if not certfile:
            continue
        expiry = _expiry(certfile)
        if expiry is not None and expiry <= deadline:
            expiring.append({"node": context.node, "protocol": protocol, "interface": config.bind, "port": port,
                             "certfile": certfile, "cacertfile": config.tls_cacertfile,
                             "expiry_date": expiry.strftime("%Y-%m-%dT%H:%M:%SZ")})
    return _failed("Certificates expiring", expired=expiring) if expiring else _ok()


def _expiry(certfile: str) -> datetime.datetime | None:
    try:
        decoded = ssl._ssl._test_decode_cert(certfile)  # type: ignore[attr-defined]  # the stdlib's PEM reader
    except (OSError, ssl.SSLError):
        return None
    seconds = ssl.cert_time_to_seconds(decoded["notAfter"])
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
