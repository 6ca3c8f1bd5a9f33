"""Configuration: defaults, then a TOML file, then WARREN_* environment variables, then the command line."""
from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import tomllib
from dataclasses import dataclass, fields
from typing import Any, Mapping, Sequence


MAX_MESSAGE_SIZE = 512 * 1024 * 1024  # RabbitMQ's ?MAX_MSG_SIZE: a larger max_message_size is taken as this


def _total_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass
class Config:
    amqp_port: int = 5672
    mgmt_port: int = 15672
    mgmt_enabled: bool = True
    bind: str = "0.0.0.0"
    data_dir: str = "warren-data"
    node_name: str = f"warren@{socket.gethostname()}"
    heartbeat: int = 60
    frame_max: int = 131072
    initial_frame_max: int = 4096  # before tune-ok, as RabbitMQ's initial_frame_max
    handshake_timeout: int = 10_000  # ms from connect to connection.open (RabbitMQ's), or to an HTTP login
    handshakes_max: int = 256  # the client ports' connections not logged in yet; one more closes the oldest
    channel_max: int = 2047
    max_message_size: int = 128 * 1024 * 1024
    consumer_timeout: int = 30 * 60 * 1000  # ms a delivery may stay unacknowledged; 0 (or false) disables
    memory_high_watermark: float = 0.4  # fraction of RAM (<= 1) or absolute bytes (> 1), as RabbitMQ
    disk_free_limit: int = 50_000_000  # bytes free on the data directory's disk below which publishers are held
    paging_ratio: float = 0.5  # of the high watermark: above it, bodies deep in queues are paged out
    queue_window: int = 2048  # ready entries a durable queue keeps in memory; the rest waits on disk
    write_buffer_high: int = 4 * 1024 * 1024
    deliveries_per_flush: int = 2000
    loopback_users_only: bool = True  # guest may log in only from loopback, as RabbitMQ
    segment_size: int = 16 * 1024 * 1024
    compaction_threshold: float = 0.5
    message_cache_bytes: int = 64 * 1024 * 1024
    definitions_max_size: int = 1 << 30  # bytes of definitions before clients' new ones are refused (the map grows)
    log_level: str = "INFO"
    cluster_etcd: str = ""  # etcd endpoint (host:port): cluster mode; empty for a single node
    cluster_secret: str = ""
    cluster_etcd_user: str = ""  # etcd's own login (with cluster_etcd_password_file)
    cluster_etcd_password_file: str = ""
    cluster_etcd_cacert: str = ""  # TLS to etcd: the CA its certificate is verified against
    cluster_etcd_cert: str = ""  # and this node's client certificate and key (etcd's --client-cert-auth)
    cluster_etcd_key: str = ""
    cluster_port: int = 0  # node-to-node links; 0 means amqp_port + 20000
    cluster_advertise: str = ""  # address other nodes dial; default the bind address or 127.0.0.1
    tls_port: int = 5671  # AMQPS; listens only when tls_certfile is set
    tls_certfile: str = ""
    tls_keyfile: str = ""
    tls_password: str = ""  # of an encrypted tls_keyfile
    tls_cacertfile: str = ""
    tls_verify: str = "verify_none"
    tls_fail_if_no_peer_cert: bool = False
    tls_cert_login_from: str = "distinguished_name"
    auth_mechanisms: str = "PLAIN AMQPLAIN"
    anonymous_login_user: str = "guest"  # whom SASL ANONYMOUS logs in as, when offered (RabbitMQ's setting)
    anonymous_login_pass: str = "guest"
    mgmt_tls: bool = False
    mgmt_tls_port: int = 15671
    mgmt_tls_certfile: str = ""  # empty: tls_certfile
    mgmt_tls_keyfile: str = ""  # empty: tls_keyfile
    mgmt_tls_password: str = ""  # of an encrypted mgmt_tls_keyfile
    mgmt_max_body_size: int = 10 * 1024 * 1024  # RabbitMQ's management.http.max_body_size; larger is 413
    mgmt_idle_timeout: float = 120.0  # s an HTTP connection may wait for (or trickle) a request's head
    metrics_auth: bool = False  # /metrics needs a monitoring or administrator login (prometheus.authentication)
    channel_flow: bool = False  # honour channel.flow active=false (pause deliveries); RabbitMQ answers 540
    explain_handshake_errors: bool = False
    stream_enabled: bool = False  # RabbitMQ's stream protocol (the rabbitmq_stream plugin) on stream_port
    stream_port: int = 5552
    stream_frame_max: int = 1048576  # RabbitMQ's stream.frame_max
    stream_advertised_host: str = ""  # what metadata and open tell clients; default the host of node_name
    stream_advertised_port: int = 0  # default stream_port

    @property
    def mechanisms(self) -> list[str]:
        return self.auth_mechanisms.replace(",", " ").upper().split()

    @property
    def stream_host(self) -> str:
        """The host the stream protocol's open and metadata name for this node: ``stream_advertised_host``, else the
        host of the node's name, as RabbitMQ's (empty if the name has none)."""
        return self.stream_advertised_host or self.node_name.partition("@")[2]

    @property
    def message_size_limit(self) -> int:
        """``max_message_size`` as every protocol applies it: at most ``MAX_MESSAGE_SIZE``, as RabbitMQ takes it at
        boot (the message store's records hold at most 1 GiB)."""
        return min(self.max_message_size, MAX_MESSAGE_SIZE)

    @property
    def memory_limit(self) -> int:
        mark = self.memory_high_watermark
        return int(mark * _total_memory()) if mark <= 1 else int(mark)


_HELP = {
    "amqp_port": "AMQP listener port",
    "mgmt_port": "management HTTP port",
    "mgmt_enabled": "serve the management HTTP API (and /metrics) on --mgmt-port",
    "bind": "address to listen on",
    "data_dir": "directory for definitions and messages",
    "node_name": "this node's name",
    "heartbeat": "heartbeat interval proposed to clients, seconds (0 disables)",
    "frame_max": "largest frame size offered to clients",
    "initial_frame_max": "largest frame accepted before connection.tune-ok (start-ok with its credentials)",
    "handshake_timeout": "ms a client has from connecting to connection.open (HTTP: to a request that logs in)",
    "handshakes_max": "connections not logged in at once across the client ports (AMQP, AMQPS, stream, HTTP, "
                      "HTTPS; a TLS one from accept); one more closes the one that waited longest",
    "channel_max": "most channels per connection",
    "max_message_size": "largest message body accepted, bytes",
    "consumer_timeout": "delivery acknowledgement timeout, ms (0 or false disables)",
    "memory_high_watermark": "memory alarm: fraction of RAM, or bytes if > 1",
    "disk_free_limit": "disk alarm: bytes free on the data directory's file system below which publishers are held",
    "paging_ratio": "fraction of the memory watermark above which every queue's tail is paged to disk",
    "queue_window": "ready messages a durable queue keeps in memory (the rest waits on disk until near the head)",
    "write_buffer_high": "bytes buffered for a slow client before delivery pauses",
    "deliveries_per_flush": "deliveries written per event-loop turn per connection",
    "loopback_users_only": "guest may log in from loopback only",
    "segment_size": "message store segment file size, bytes",
    "compaction_threshold": "dead fraction of a segment that triggers its compaction",
    "message_cache_bytes": "message store read cache, bytes",
    "definitions_max_size": "bytes the definition store may hold before clients' new durable queues, exchanges, "
                            "bindings and policies are refused (406); users, permissions, vhosts, imports and "
                            "deletes always go through",
    "log_level": "DEBUG, INFO, WARNING or ERROR",
    "cluster_etcd": "etcd endpoint (host:port) shared by the cluster's nodes; empty runs a single node",
    "cluster_secret": "shared secret authenticating node-to-node links (required in cluster mode)",
    "cluster_etcd_user": "etcd user this node logs in as (etcd's auth enabled)",
    "cluster_etcd_password_file": "file holding that user's etcd password (its first line)",
    "cluster_etcd_cacert": "PEM CA bundle etcd's certificate is verified against: TLS to etcd",
    "cluster_etcd_cert": "PEM client certificate this node shows etcd (etcd's --client-cert-auth)",
    "cluster_etcd_key": "PEM private key of --cluster-etcd-cert",
    "cluster_port": "port for node-to-node links (default AMQP port + 20000)",
    "cluster_advertise": "address the other nodes dial for links (default the bind address, or 127.0.0.1)",
    "tls_port": "AMQPS listener port, served when --tls-certfile is set",
    "tls_certfile": "PEM server certificate (chain) for AMQPS",
    "tls_keyfile": "PEM private key of the certificate (empty: in the certificate file)",
    "tls_password": "password of the private key when it is encrypted (ssl_options.password)",
    "tls_cacertfile": "PEM CA bundle that client certificates are verified against",
    "tls_verify": "verify_none or verify_peer: whether clients are asked for a certificate (needs --tls-cacertfile)",
    "tls_fail_if_no_peer_cert": "with verify_peer: refuse the TLS handshake of a client without a certificate",
    "tls_cert_login_from": "EXTERNAL login name: distinguished_name (RFC 4514 subject) or common_name",
    "auth_mechanisms": "SASL mechanisms offered, of PLAIN, AMQPLAIN, EXTERNAL (EXTERNAL on TLS only), ANONYMOUS",
    "anonymous_login_user": "the user SASL ANONYMOUS logs in as (when auth_mechanisms offers it)",
    "anonymous_login_pass": "that user's password",
    "mgmt_tls": "also serve the management API over HTTPS on --mgmt-tls-port",
    "mgmt_tls_port": "management HTTPS port",
    "mgmt_tls_certfile": "PEM certificate for HTTPS (empty: --tls-certfile)",
    "mgmt_tls_keyfile": "PEM key for HTTPS (empty: --tls-keyfile)",
    "mgmt_tls_password": "password of --mgmt-tls-keyfile when it is encrypted (management.ssl.password)",
    "mgmt_max_body_size": "largest HTTP request body, bytes (larger: 413)",
    "mgmt_idle_timeout": "seconds an HTTP connection may stay idle or take to send a request's headers",
    "metrics_auth": "require a monitoring or administrator login for /metrics",
    "channel_flow": "honour channel.flow active=false by pausing deliveries (RabbitMQ: 540 NOT_IMPLEMENTED)",
    "stream_enabled": "serve RabbitMQ's stream protocol (rstream, rbfly, the Java/Go/.NET stream clients) on "
                      "--stream-port",
    "stream_port": "stream protocol port (with --stream-enabled)",
    "stream_frame_max": "largest stream protocol frame offered to clients, bytes",
    "stream_advertised_host": "host the stream protocol's metadata names for this node (default: the address the "
                              "client connected to)",
    "stream_advertised_port": "port the stream protocol's metadata names for this node (default --stream-port)",
    "explain_handshake_errors": "answer a failed handshake with connection.close saying why (RabbitMQ: drops "
                                "the socket after 3 s)",
}
_CHOICES = {
    "tls_verify": ("verify_none", "verify_peer"),
    "tls_cert_login_from": ("distinguished_name", "common_name"),
}
MECHANISMS = ("PLAIN", "AMQPLAIN", "EXTERNAL", "ANONYMOUS")


def _convert(kind: type, value: Any) -> Any:
    if kind is str and isinstance(value, list):  # TOML: auth_mechanisms = ["PLAIN", "EXTERNAL"]
        return " ".join(map(str, value))
    if kind is bool and isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    if kind is int and isinstance(value, str) and value.strip().lower() == "false":  # consumer_timeout = false
        return 0
    return kind(value)


def load(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> Config:
    environ = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(prog="warren-server", description="Warren AMQP 0-9-1 broker")
    parser.add_argument("--config", metavar="FILE", default=environ.get("WARREN_CONFIG"),
                        help="TOML file with any of the options below (env WARREN_CONFIG)")
    for field in fields(Config):
        flag = "--" + field.name.replace("_", "-")
        env = "WARREN_" + field.name.upper()
        if field.type in ("bool", bool):
            parser.add_argument(flag, dest=field.name, default=None, type=lambda v: _convert(bool, v),
                                metavar="BOOL", help=f"{_HELP[field.name]} (env {env})")
        else:
            parser.add_argument(flag, dest=field.name, default=None, help=f"{_HELP[field.name]} (env {env})")
    args = parser.parse_args(argv)
    values: dict[str, Any] = {}
    if args.config:
        with open(args.config, "rb") as handle:
            table = tomllib.load(handle)
        unknown = set(table) - {f.name for f in fields(Config)}
        if unknown:
            parser.error(f"unknown option(s) in {args.config}: {', '.join(sorted(unknown))}")
        values.update(table)
    for field in fields(Config):
        from_env = environ.get("WARREN_" + field.name.upper())
        if from_env is not None:
            values[field.name] = from_env
        cli = getattr(args, field.name)
        if cli is not None:
            values[field.name] = cli
    config = Config()
    for field in fields(Config):
        if field.name in values:
            kind = type(getattr(config, field.name))
            try:
                setattr(config, field.name, _convert(kind, values[field.name]))
            except ValueError:
                parser.error(f"bad value for {field.name}: {values[field.name]!r}")
    if len(config.node_name.encode()) > 255:  # (an Erlang node name is an atom) it must fit a link's handshake
        parser.error(f"node_name may be at most 255 bytes, not {len(config.node_name.encode())}")
    if config.queue_window < 1:
        parser.error(f"queue_window must be at least 1, not {config.queue_window}")
    for name, choices in _CHOICES.items():
        if getattr(config, name) not in choices:
            parser.error(f"{name} must be one of {', '.join(choices)}, not {getattr(config, name)!r}")
    strangers = [m for m in config.mechanisms if m not in MECHANISMS]
    if strangers:
        parser.error(f"unknown auth_mechanisms: {', '.join(strangers)} (known: {', '.join(MECHANISMS)})")
    if config.mgmt_tls and not (config.mgmt_tls_certfile or config.tls_certfile):
        parser.error("mgmt_tls needs mgmt_tls_certfile or tls_certfile")
    if config.tls_certfile:  # options ssl:listen/2 refuses: RabbitMQ serves no TLS port with them
        if config.tls_fail_if_no_peer_cert and config.tls_verify != "verify_peer":
            parser.error("tls_fail_if_no_peer_cert needs tls_verify verify_peer")
        if config.tls_verify == "verify_peer" and not config.tls_cacertfile:
            parser.error("tls_verify verify_peer needs tls_cacertfile (the CAs client certificates are checked "
                         "against)")
    return config


def as_dict(config: Config) -> dict[str, Any]:
    return dataclasses.asdict(config)
