"""Warren's AMQP 0-9-1 server: listener, connections, channels, the broker object, queues,
access control and durable definitions.

Public surface: :class:`~amqp_server.broker.Broker` (the operations every front end
uses), :func:`~amqp_server.server.main` (``warren-server``) and
:func:`~amqp_server.admin.main` (``warren-admin``).
"""
__version__ = "0.1.0"
