"""Warren's node: the broker and its services, queues and their types, the protocol front ends, access control and
durable definitions.

Its packages: ``broker`` (the broker's services), ``queues`` (a queue, its components and types), ``framing``
(AMQP 0-9-1's wire format), ``amqp091``, ``amqp1`` and ``stream`` (the front ends, over ``frontend``),
``links``, ``shovel`` and ``federation``, ``spark_bridge`` and ``node`` (the programs).  The modules directly here
are what all of them share: errors, logs, the clock, configuration, the message, access control and the
definition store.

Public surface: :class:`~amqp_server.broker.Broker` (the operations every front end
uses), :func:`~amqp_server.node.server.main` (``warren-server``) and
:func:`~amqp_server.node.admin.main` (``warren-admin``).
"""
__version__ = "0.1.0"
