"""The node's etcd client: etcd's own login (user and password) and TLS (a CA, a client certificate), and the
check at start that etcd takes them.

etcd holds the cluster's users and definitions: whoever can write there can make an administrator on every node.
With ``--cluster-etcd-user`` the node logs in (``--cluster-etcd-password-file``), with ``--cluster-etcd-cacert``
it verifies etcd's certificate, and with ``--cluster-etcd-cert``/``--cluster-etcd-key`` it shows its own, as
etcd's ``--client-cert-auth`` asks.  A node whose credentials etcd refuses does not start: it says why.  An
etcd that does not answer at all is another matter: the node serves its mirrored definitions until it does.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
from typing import TYPE_CHECKING, Any, Callable
from urllib.parse import urlparse

import aetcd
import grpc
from aetcd import rpc, watcher

if TYPE_CHECKING:
    from amqp_server.config import Config

log = logging.getLogger("warren.forwarder.etcd")

CHECK_TIMEOUT = 5.0
# what a refusal of our credentials says, as etcd and gRPC word it (an etcd that is down says none of these)
# (TSI_: gRPC's TLS layer, e.g. etcd's alert that it refused our certificate, which TLS 1.3 delivers after the
# handshake as "Unwrap failed (TSI_DATA_CORRUPTED)")
_REFUSALS = ("authentication failed", "user name is empty", "permission denied", "invalid auth token",
             "tls handshake", "ssl_error", "certificate", "tsi_")


class EtcdRefused(PermissionError):
    """etcd refused this node's credentials, or they could not be read: the node cannot start (an OSError, which
    ``main`` reports as a failure to start)."""


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise EtcdRefused(f"cannot read {what} {path}: {exc.strerror}") from None


class _Token(grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor,
             grpc.aio.StreamStreamClientInterceptor):
    """etcd's auth token on every call, and a new one when etcd no longer takes it: etcd forgets its simple
    tokens when it restarts (and refuses those older than a change of its users).  A unary call is made again
    with the new token; a stream (a watch, a lease's keep-alive) fails, and its caller's next call, which is
    unary, logs in again."""

    def __init__(self, name: str, password: str, timeout: int) -> None:
        self.name, self.password, self.timeout = name, password, timeout
        self.channel: grpc.aio.Channel | None = None
        self.token: str | None = None

    async def login(self) -> None:
        reply = await rpc.AuthStub(self.channel).Authenticate(
            rpc.AuthenticateRequest(name=self.name, password=self.password), timeout=self.timeout)
        self.token = reply.token

    def _with_token(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        if self.token is None or details.method.endswith(b"/Authenticate"):
            return details
        return details._replace(metadata=grpc.aio.Metadata(*(details.metadata or ()), ("token", self.token)))

    async def intercept_unary_unary(self, continuation: Any, details: grpc.aio.ClientCallDetails,
                                    request: Any) -> Any:
        call = await continuation(self._with_token(details), request)
        try:
            await call
        except rpc.AioRpcError as exc:
            if not _stale_token(exc) or details.method.endswith(b"/Authenticate"):
                raise
            log.info("etcd no longer takes this node's auth token (%s): logging in again", exc.details())
            await self.login()
            return await continuation(self._with_token(details), request)
        return call

    async def intercept_unary_stream(self, continuation: Any, details: grpc.aio.ClientCallDetails,
                                     request: Any) -> Any:
        return await continuation(self._with_token(details), request)

    async def intercept_stream_stream(self, continuation: Any, details: grpc.aio.ClientCallDetails,
                                      request_iterator: Any) -> Any:
        return await continuation(self._with_token(details), request_iterator)


def _stale_token(exc: rpc.AioRpcError) -> bool:
    details = (exc.details() or "").lower()
    return (exc.code() == grpc.StatusCode.UNAUTHENTICATED and "invalid auth token" in details
            or "auth store is old" in details)


class _Watcher(watcher.Watcher):
    """aetcd's watcher, each watch created under an id of ours.  aetcd takes the next "created" answer for the
    watch it waits for: after a create that timed out (etcd frozen, or slow), the late answer to it was taken for
    the next watch, which then followed the other's keys while its own was cancelled as a stale one's.  An answer
    under another id than the one awaited is now that stale watch's, and cancelled.  (Watch ids a client picks
    are etcd 3.4's and later's.)"""

    def __init__(self, stub: rpc.WatchStub, timeout: int | None) -> None:
        super().__init__(stub, timeout=timeout, metadata=None)
        self._ids = itertools.count(1)  # (unique on a stream, which is all etcd asks)
        self._awaited = 0  # the id of the watch whose create is awaited

    async def add_callback(self, key: bytes, callback: Callable[..., Any], **options: Any) -> Any:
        options["watch_id"] = next(self._ids)
        return await super().add_callback(key, callback, **options)

    async def _enqueue_watch_create(self, *args: Any, **kwargs: Any) -> None:
        request = self._build_watch_create_request(*args, **kwargs)
        request.create_request.watch_id = self._awaited = kwargs["watch_id"]  # (aetcd leaves it out)
        await self._request_queue.put(request)

    async def _handle_response(self, response: Any) -> None:
        if response.created and self._new_callback is not None and response.watch_id != self._awaited:
            await self._enqueue_watch_cancel(watch_id=response.watch_id)
            return
        await super()._handle_response(response)


# gRPC's channel waits between tries to connect 1 s, then 1.6 times longer each time, up to 120 s: once etcd was out
# of reach for 10 s (a restart, a cut), a node heard it again up to 7 s after it was back, and a queue whose leader
# died meanwhile elected none until then.  A try every half second at most costs etcd nothing.  A try is given
# 2 s (gRPC's "min reconnect backoff" is that, 20 s by default): one whose packets a partition drops is not waited
# for past that, as a handshake on a healthy network takes milliseconds.
RECONNECT = {"grpc.initial_reconnect_backoff_ms": 250, "grpc.max_reconnect_backoff_ms": 500,
             "grpc.min_reconnect_backoff_ms": 2000}


class EtcdClient(aetcd.Client):
    """aetcd's client over TLS when ``credentials`` are given (aetcd itself dials in plain text only), its login
    kept by a :class:`_Token` (aetcd's would hold the first token until the node restarts)."""

    _is_connecting: bool

    def __init__(self, host: str, port: int, username: str | None, password: str | None,
                 credentials: grpc.ChannelCredentials | None, timeout: int) -> None:
        super().__init__(host=host, port=port, timeout=timeout, options=RECONNECT)
        self._credentials = credentials
        self._token = None if username is None else _Token(username, password or "", timeout)

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        if self._is_connecting:
            await asyncio.wait_for(self._connected.wait(), self._connect_wait_timeout)
            return
        try:
            self._is_connecting = True
            target, options = f"{self._host}:{self._port}", list(self._options.items())
            interceptors = [] if self._token is None else [self._token]
            if self._credentials is None:
                self.channel = rpc.insecure_channel(target, options=options, interceptors=interceptors)
            else:
                self.channel = rpc.secure_channel(target, self._credentials, options=options,
                                                  interceptors=interceptors)
            if self._token is not None:
                self._token.channel = self.channel
                try:
                    await self._token.login()
                except rpc.AioRpcError as exc:
                    aetcd.exceptions._handle_exception(exc)
            self.kvstub = rpc.KVStub(self.channel)
            self.clusterstub = rpc.ClusterStub(self.channel)
            self.leasestub = rpc.LeaseStub(self.channel)
            self.maintenancestub = rpc.MaintenanceStub(self.channel)
            self._watcher = _Watcher(rpc.WatchStub(self.channel), self._timeout)
            self._connected.set()
        finally:
            self._is_connecting = False


def client(config: "Config") -> EtcdClient:
    """The client ``config`` asks for: ``--cluster-etcd`` (``host:port`` or ``https://host:port``), its login and
    its TLS files, read now (an unreadable one is :class:`EtcdRefused`)."""
    endpoint = config.cluster_etcd
    url = urlparse(endpoint if "//" in endpoint else f"http://{endpoint}")
    password: str | None = None
    if config.cluster_etcd_user:
        if not config.cluster_etcd_password_file:
            raise EtcdRefused("--cluster-etcd-user needs --cluster-etcd-password-file")
        password = _read(config.cluster_etcd_password_file, "etcd password file").decode().rstrip("\r\n")
    elif config.cluster_etcd_password_file:
        raise EtcdRefused("--cluster-etcd-password-file needs --cluster-etcd-user")
    if bool(config.cluster_etcd_cert) != bool(config.cluster_etcd_key):
        raise EtcdRefused("--cluster-etcd-cert and --cluster-etcd-key go together")
    credentials = None
    if url.scheme == "https" or config.cluster_etcd_cacert or config.cluster_etcd_cert:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read(config.cluster_etcd_cacert, "etcd CA file") if config.cluster_etcd_cacert
            else None,
            private_key=_read(config.cluster_etcd_key, "etcd client key") if config.cluster_etcd_key else None,
            certificate_chain=_read(config.cluster_etcd_cert, "etcd client certificate")
            if config.cluster_etcd_cert else None)
    return EtcdClient(url.hostname or "127.0.0.1", url.port or 2379, config.cluster_etcd_user or None, password,
                      credentials, timeout=5)


def refusal(exc: BaseException) -> str | None:
    """What ``exc`` says if it is etcd (or its TLS) refusing our credentials; None for anything else."""
    text = str(exc)
    cause = exc.__cause__
    if isinstance(cause, rpc.AioRpcError):
        text = f"{cause.code().name}: {cause.details()}"
        if cause.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            return text
    if isinstance(exc, aetcd.exceptions.UnauthenticatedError):
        return text
    lowered = text.lower()
    return text if any(word in lowered for word in _REFUSALS) else None


async def check(etcd: aetcd.Client, endpoint: str, prefix: bytes) -> None:
    """Log in and read under ``prefix``: :class:`EtcdRefused` if etcd refuses; an etcd that does not answer
    within ``CHECK_TIMEOUT`` is left to the retries that follow."""
    try:
        await asyncio.wait_for(etcd.get(prefix), CHECK_TIMEOUT)
    except asyncio.TimeoutError:
        log.warning("etcd at %s did not answer within %.0f s", endpoint, CHECK_TIMEOUT)
    except aetcd.exceptions.ClientError as exc:
        why = refusal(exc)
        if why is not None:
            raise EtcdRefused(f"etcd at {endpoint} refused this node: {why}") from None
        log.warning("etcd at %s: %s", endpoint, exc)

