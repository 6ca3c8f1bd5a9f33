"""``warrenctl``, the command-line client of the management HTTP API (like rabbitmqadmin).

It talks to a node over HTTP only and imports nothing of the broker: ``main`` parses the command line
(``main.py``), ``commands`` turns each sub-command into API calls through ``client``, ``render`` prints
tables or JSON, ``values`` parses typed arguments, and ``export`` writes queues to Parquet through the
Spark bridge.
"""
from .main import main

__all__ = ["main"]
