"""Cluster mode: several Warren nodes acting as one broker.

Definitions are agreed in etcd (:mod:`.metadata`), nodes find each other there
(:mod:`.membership`) and forward messages over authenticated node-to-node links
(:mod:`.link`, :mod:`.peer`, :mod:`.session`); a queue owned by another node is a
:class:`.RemoteQueue` here.  A quorum queue is replicated: a leader elected through etcd
(:mod:`.quorum`) ships its log to the followers (:mod:`.quorum_log`).  Single-node Warren never
imports this package.
"""
from .cluster import Cluster
from .remote_queue import RemoteQueue

__all__ = ["Cluster", "RemoteQueue"]
