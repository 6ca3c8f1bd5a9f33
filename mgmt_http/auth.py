"""HTTP basic auth against the broker's users, and RabbitMQ's management tags.

``administrator`` may do anything; ``monitoring`` sees every vhost listed, every connection and
channel and the node, but the objects (queues, exchanges, bindings, policies) of the vhosts it has
permissions on only, as ``policymaker`` and ``management`` (who also see only their own connections).
A user with none of these tags may not use the API.  As RabbitMQ's plugin, both "who are you?" and "you may not" are 401
(only the former asks for credentials with ``WWW-Authenticate``).
"""
from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Awaitable, Callable

from aiohttp import web

from amqp_server.access_control import MANAGEMENT_TAGS, Principal, User, loopback_refused
from amqp_server.broker import Broker

from . import expect
from .context import ctx
from .gate import gate_of, let_next_head
from .http import HTTPError, not_authorised, not_found

REALM = 'Basic realm="RabbitMQ Management"'
PUBLIC_PREFIXES = ("/metrics",)


@dataclass(frozen=True)
class Login:
    user: User

    @property
    def name(self) -> str:
        return self.user.name

    @property
    def tags(self) -> list[str]:
        return self.user.tags

    @property
    def is_admin(self) -> bool:
        return "administrator" in self.user.tags

    @property
    def is_monitor(self) -> bool:
        return self.is_admin or "monitoring" in self.user.tags

    @property
    def is_policymaker(self) -> bool:
        return self.is_admin or "policymaker" in self.user.tags

    @property
    def is_management(self) -> bool:
        return any(tag in MANAGEMENT_TAGS for tag in self.user.tags)


LOGIN = web.RequestKey("login", Login)  # who a request logged in as (its middleware, or the route, set it)


def unauthenticated(reason: str, error: str = "not_authorised") -> HTTPError:
    return HTTPError(401, error, reason, {"WWW-Authenticate": REALM})


def _credentials(header: str) -> tuple[str, str]:
    """The Authorization header's user and password, refused as RabbitMQ refuses it: a token is a failed login
    (it would be OAuth 2's), a header that is no Basic credentials a bare 400."""
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() == "bearer":
        raise login_failed()
    try:
        if scheme.lower() != "basic":
            raise ValueError(scheme)
        name, sep, password = base64.b64decode(encoded.strip(), validate=True).partition(b":")
    except (binascii.Error, ValueError):
        raise HTTPError(400, None, None) from None
    if not sep:
        raise HTTPError(400, None, None)
    return name.decode(errors="replace"), password.decode(errors="replace")


def login_failed() -> HTTPError:
    return unauthenticated("Login failed", "not_authorized")  # RabbitMQ's spelling, for this case only


def authenticate(request: web.Request, broker: Broker, loopback_only_guest: bool) -> Login:
    header = request.headers.get("Authorization")
    if not header:
        raise HTTPError(401, None, None, {"WWW-Authenticate": REALM})  # a bare 401 asks for credentials
    name, password = _credentials(header)
    user = broker.access.authenticate(name, password)
    broker.auth_attempts.record("http", user is not None)
    if user is None:
        raise login_failed()
    if loopback_refused(user, request.remote, loopback_only_guest):
        raise unauthenticated("User can only log in via localhost")
    login = Login(user)
    if not login.is_management:
        raise not_authorised("Not management user")
    return login


def auth_middleware(broker: Broker, loopback_only_guest: bool, metrics_auth: bool = False) -> Callable:
    """Every /api/ request logs in before its handler runs (so before any body is read); /metrics too with
    ``metrics_auth``, as a monitoring user (RabbitMQ's prometheus.authentication.enabled).  The connection's
    gate (``gate.py``) is told: it reads on past the head once a request has logged in."""
    @web.middleware
    async def middleware(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                         ) -> web.StreamResponse:
        gate = gate_of(request)
        try:
            if request.path.startswith("/api/") and request.path != "/api/auth" and request.method != "OPTIONS":
                # (the UI asks /api/auth before a login; OPTIONS is answered without one, as rabbit_mgmt_util's)
                request[LOGIN] = authenticate(request, broker, loopback_only_guest)
            elif metrics_auth and request.path.startswith(PUBLIC_PREFIXES):
                request[LOGIN] = authenticate(request, broker, loopback_only_guest)
                require_monitor(request)
            if LOGIN in request:
                if gate is not None:
                    gate.logged_in()
                await expect.proceed(request, ctx(request).config.mgmt_max_body_size)
            return await handler(request)
        finally:
            let_next_head(request)

    return middleware


def login(request: web.Request) -> Login:
    return request[LOGIN]


def require_admin(request: web.Request) -> Login:
    user = login(request)
    if not user.is_admin:
        raise not_authorised("Not administrator user")
    return user


def require_monitor(request: web.Request) -> Login:
    user = login(request)
    if not user.is_monitor:
        raise not_authorised("Not monitor user")
    return user


def has_vhost_access(broker: Broker, user: Login, vhost: str) -> bool:
    """RabbitMQ's is_authorized_vhost (``is_admin orelse user_matches_vhost``): an administrator, or a user that may
    log in to the vhost (it has permissions there, what check_vhost_access asks).  Monitoring is not access."""
    return user.is_admin or broker.access.permissions(vhost, user.name) is not None


def can_see_vhost(broker: Broker, user: Login, vhost: str) -> bool:
    """RabbitMQ's is_authorized_vhost_visible (list_visible_vhosts): a monitoring user sees every vhost."""
    return user.is_monitor or has_vhost_access(broker, user, vhost)


def visible_vhosts(request: web.Request) -> list[str]:
    """The vhosts a user may see listed (list_visible_vhosts): every one for monitoring and administrators."""
    broker = ctx(request).broker
    user = login(request)
    return [name for name in broker.access.vhosts() if can_see_vhost(broker, user, name)]


def login_vhosts(request: web.Request) -> list[str]:
    """The vhosts whose objects a listing shows (RabbitMQ's filter_vhost): every one for an administrator, else
    those the user may log in to, monitoring or not."""
    broker = ctx(request).broker
    user = login(request)
    return [name for name in broker.access.vhosts() if has_vhost_access(broker, user, name)]


def require_vhost(request: web.Request, name: str | None = None, creating: bool = False,
                  visible: bool = False) -> str:
    """The path's vhost: 404 if there is none such (RabbitMQ's ``vhost_not_found`` when ``creating`` something
    in it), 401 if the user has no access to it (``has_vhost_access``; ``can_see_vhost`` with ``visible``)."""
    broker = ctx(request).broker
    vhost = request.match_info["vhost"] if name is None else name
    if not broker.access.vhost_exists(vhost):
        raise HTTPError(404, "not_found", "vhost_not_found") if creating else not_found()
    allowed = can_see_vhost if visible else has_vhost_access
    if not allowed(broker, login(request), vhost):
        raise not_authorised("User not authorised to access virtual host")
    return vhost


def require_policymaker(request: web.Request) -> Login:
    """RabbitMQ's is_authorized_policies (a policy, parameters) and is_authorized_global_parameters: an
    administrator, or a policymaker with access to the path's vhost if it names one that exists (an unknown one
    is the handler's 404); else 401 "User not authorised to access object", for a vhost refused too."""
    broker = ctx(request).broker
    user = login(request)
    vhost = request.match_info.get("vhost")
    if user.is_admin or (user.is_policymaker and (vhost is None or not broker.access.vhost_exists(vhost)
                                                  or has_vhost_access(broker, user, vhost))):
        return user
    raise not_authorised("User not authorised to access object")


def principal(request: web.Request, vhost: str) -> Principal:
    """The logged-in user with its permissions in ``vhost``: what the broker's operations check."""
    return ctx(request).broker.access.principal(vhost, login(request).name)
