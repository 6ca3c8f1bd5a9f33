"""AMQP 0-9-1's wire format, as the whole node keeps it: a message's content stays in it from publish to delivery.

``codec`` writes the hot path's frames without pamqp objects; ``properties`` and ``header_table`` read and replace
a content header's properties and headers table on the bytes; ``field_types`` names a table value's AMQP type.
The core and every front end use them, so they sit below both.
"""
