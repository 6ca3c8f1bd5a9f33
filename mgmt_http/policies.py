"""/api/policies and /api/operator-policies: list, show, set, clear (RabbitMQ's rabbit_mgmt_wm_policy)."""
from __future__ import annotations

import html

from aiohttp import web

from amqp_server.queues.policy import OPERATOR_POLICY, POLICY, PolicyError, parse

from . import auth
from .context import ctx
from .http import bad_request, created_or_updated, no_content, not_found, read_json
from .listing import respond, respond_one

routes = web.RouteTableDef()
KINDS = {"policies": POLICY, "operator-policies": OPERATOR_POLICY}


def _require(request: web.Request, kind: str) -> None:
    """One policy: the policymaker tag (or administrator) and access to its vhost, as rabbit_mgmt_wm_policy's
    is_authorized_policies; an operator policy administrator (rabbit_mgmt_wm_operator_policy)."""
    if kind == OPERATOR_POLICY:
        auth.require_admin(request)
    else:
        auth.require_policymaker(request)


def _kind(request: web.Request) -> str:
    kind = KINDS[request.match_info["kind"]]
    _require(request, kind)
    return kind


def _listed(request: web.Request, kind: str, vhosts: list[str]) -> web.Response:
    policies = ctx(request).broker.policies
    return respond(request, [p.to_json() for vhost in vhosts for p in policies.list(kind, vhost)],
                   ("priority", "vhost", "name"))  # RabbitMQ lists policies by priority


@routes.get("/api/{kind:policies|operator-policies}")
async def list_all(request: web.Request) -> web.Response:
    """Any user lists the policies of its vhosts (rabbit_mgmt_wm_policies and _operator_policies:
    is_authorized_vhost and filter_vhost), no tag needed."""
    return _listed(request, KINDS[request.match_info["kind"]], auth.login_vhosts(request))


@routes.get("/api/{kind:policies|operator-policies}/{vhost}")
async def list_vhost(request: web.Request) -> web.Response:
    return _listed(request, KINDS[request.match_info["kind"]], [auth.require_vhost(request)])


@routes.get("/api/{kind:policies|operator-policies}/{vhost}/{name}")
async def show(request: web.Request) -> web.Response:
    kind = _kind(request)
    policy = ctx(request).broker.policies.get(kind, auth.require_vhost(request), request.match_info["name"])
    if policy is None:
        raise not_found()
    return respond_one(request, policy.to_json())


@routes.put("/api/{kind:policies|operator-policies}/{vhost}/{name}")
async def put(request: web.Request) -> web.Response:
    kind = _kind(request)
    vhost = auth.require_vhost(request, creating=True)
    name = request.match_info["name"]
    try:
        policy = parse(vhost, name, await read_json(request), kind == OPERATOR_POLICY)
    except PolicyError as exc:  # RabbitMQ escapes a user policy's reason for HTML (not an operator policy's)
        raise bad_request(html.escape(str(exc), quote=False) if kind == POLICY else str(exc)) from None
    broker = ctx(request).broker
    existed = broker.policies.get(kind, vhost, name) is not None
    broker.set_policy(kind, policy, auth.principal(request, vhost))
    return created_or_updated(not existed)


@routes.delete("/api/{kind:policies|operator-policies}/{vhost}/{name}")
async def delete(request: web.Request) -> web.Response:
    kind = _kind(request)
    vhost = auth.require_vhost(request)
    broker = ctx(request).broker
    if not broker.policies.delete(kind, broker.vhost(vhost), request.match_info["name"]):
        raise not_found()
    return no_content()
