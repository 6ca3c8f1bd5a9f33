"""Cluster mode: several Warren nodes acting as one broker.

Definitions are agreed in etcd (:mod:`.metadata.mirror`), nodes find each other there
(:mod:`.metadata.membership`) and forward messages over authenticated node-to-node links
(:mod:`.peers.node_link`, :mod:`.peers.peer`, :mod:`.peers.owner_side`); a queue owned by another node is a
:class:`.RemoteQueue` here.  A quorum queue is replicated: a leader elected through etcd
(:mod:`.quorum.groups`) ships its log to the followers (:mod:`.quorum.oplog`).  Single-node Warren never
imports this package.
"""
from .cluster import Cluster
from .peers.remote_queue import RemoteQueue

__all__ = ["Cluster", "RemoteQueue"]
