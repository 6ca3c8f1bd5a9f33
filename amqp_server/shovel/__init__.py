"""Dynamic shovels (RabbitMQ's rabbitmq_shovel): move messages from a queue or exchange of one broker to another,
defined by ``shovel`` runtime parameters.  ``definition`` validates a parameter's value as RabbitMQ does,
``worker`` runs one shovel (a ``links.link.Link`` over two AMQP 0-9-1 connections), ``manager`` keeps one worker
per parameter this node runs."""
from __future__ import annotations

from .definition import validate
from .manager import COMPONENT, Shovels

__all__ = ["COMPONENT", "Shovels", "validate"]
