"""A stream's messages on disk, laid out as RabbitMQ's osiris lays them out.

``log.StreamLog``: segment files of chunks and an index beside each; ``chunk``: the chunk format (also what the
stream protocol's deliver frame carries); ``tracking``: consumers' stored offsets; ``amqp10``: the AMQP 1.0
records a stream keeps and the AMQP 1.0 type codec they are written with.
"""
