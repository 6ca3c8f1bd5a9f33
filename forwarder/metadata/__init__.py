"""What the cluster agrees in etcd: ``etcd`` (the client, its login and TLS), ``mirror.Metadata`` (definitions in etcd
mirrored into this node's LMDB), ``membership`` (which nodes exist and where their links listen) and ``signing``
(a node applies only what a node wrote).
"""
