"""The node's own AMQP 0-9-1 connections to brokers (itself included), as shovels and federation make them:
``client`` (a small client that passes content on as bytes), ``uri`` (AMQP URIs, read and redacted as RabbitMQ
does), ``link`` (a link's life of sessions, and a session's transfer of messages), ``runner`` (the links a node's
definitions ask for, kept running) and ``validation`` (their parameters' checks, as RabbitMQ makes them)."""
