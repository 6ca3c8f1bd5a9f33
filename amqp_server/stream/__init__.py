"""RabbitMQ's stream protocol (the rabbitmq_stream plugin): its own port, serving the node's streams."""
