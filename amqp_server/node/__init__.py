"""The node's programs: ``server.main`` (``warren-server``: the listeners, the broker, the cluster, the HTTP API) and
``admin.main`` (``warren-admin``: users, vhosts and permissions in a node's definition store).
"""
