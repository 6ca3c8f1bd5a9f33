"""AMQP 1.0 as RabbitMQ 4.x serves it, beside AMQP 0-9-1 on the AMQP port: framing (``frames``), the connection
and its sessions and links (``connection``), addresses (``address``) and the ``/management`` node."""
