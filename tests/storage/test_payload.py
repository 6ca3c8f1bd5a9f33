"""The stored and shipped layout of a message (``amqp_server.payload``): a record with AMQP 1.0 sections and one
without read back the same way, one at a time and many at once (the Spark bridge's ``spans``)."""
from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from amqp_server import payload

ROUTES = st.builds(lambda ex, rk: bytes([len(ex)]) + ex + bytes([len(rk)]) + rk,
                   st.binary(max_size=255), st.binary(max_size=255))
RECORDS = st.tuples(ROUTES, st.binary(min_size=14, max_size=64), st.binary(max_size=64),
                    st.none() | st.binary(max_size=300))


@given(st.lists(RECORDS, min_size=1, max_size=8))
def test_a_record_with_or_without_amqp10_sections_reads_back_as_written(records):
    whole = [b"".join(payload.encode(*record)) for record in records]
    for data, (route, header, body, sections) in zip(whole, records):
        assert payload.decode(data) == (route, header, body, sections)
        assert payload.decode(b"pad" + data, 3) == (route, header, body, sections)
        assert payload.body_size(data) == len(body)
    at = np.cumsum([0] + [len(data) for data in whole[:-1]])
    route_at, header_at, body_at = payload.spans(np.frombuffer(b"".join(whole), np.uint8), at)
    buffer = b"".join(whole)
    for i, (route, header, body, _) in enumerate(records):
        assert buffer[route_at[i]:header_at[i]] == route and buffer[header_at[i]:body_at[i]] == header
        assert buffer[body_at[i]:body_at[i] + len(body)] == body
