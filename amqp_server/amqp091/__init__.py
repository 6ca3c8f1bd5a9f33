"""The AMQP 0-9-1 front end (RabbitMQ's rabbit_reader and rabbit_channel).

``connection.Connection`` reads frames, shakes hands and holds the channels; ``channel.Channel`` turns methods into
broker operations; ``consumer_timeout`` closes a channel that holds a delivery too long.
"""
