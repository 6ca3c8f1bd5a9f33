"""Quorum queues across nodes: ``groups`` (leadership through etcd, the members of each queue's group) and ``oplog``
(the state machine's ops on the wire: the leader ships them, a follower applies them to its copy).
"""
