"""Definitions in etcd signed with the cluster secret: a node applies only what a node wrote.

Whoever can write to etcd could otherwise create an administrator on every node.  Each record a node puts
carries ``MAC_FIELD``: an HMAC-SHA256, under a key derived from ``--cluster-secret``, of its etcd key and its
canonical JSON.  A record read without a valid one is not applied (and logged): the node keeps what it had.  A
delete carries nothing to sign, so a writer without the secret can still remove definitions, not make or change
them; etcd's own authentication (``forwarder.metadata.etcd``) is what stops that.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
from typing import Any

from amqp_server.logs import untrusted

log = logging.getLogger("warren.forwarder.signing")

MAC_FIELD = "_mac"


def _canonical(key: bytes, record: dict[str, Any]) -> bytes:
    return key + b"\n" + json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


class Signer:
    def __init__(self, secret: bytes) -> None:
        self._key = hmac.new(secret, b"warren etcd definitions", hashlib.sha256).digest()

    def _mac(self, key: bytes, record: dict[str, Any]) -> str:
        return hmac.new(self._key, _canonical(key, record), hashlib.sha256).hexdigest()

    def seal(self, key: bytes, record: dict[str, Any]) -> bytes:
        """The value to put at ``key``: the record with its MAC."""
        return json.dumps({**record, MAC_FIELD: self._mac(key, record)}).encode()

    def open(self, key: bytes, value: bytes) -> tuple[dict[str, Any], bool]:
        """The record at ``key`` without its MAC, and whether the MAC was there and right."""
        record = json.loads(value)
        if not isinstance(record, dict):
            return {}, False
        mac = record.pop(MAC_FIELD, None)
        return record, isinstance(mac, str) and hmac.compare_digest(mac, self._mac(key, record))

    @staticmethod
    def refused(key: bytes, revision: int) -> None:
        log.warning("etcd definition %s (revision %d) is not signed with the cluster secret: not applied",
                    untrusted(key.decode(errors="replace")), revision)
