"""The Spark bridge's broker side: a queue's contents by offset, read into Arrow record batches and committed away.

``queue_reads`` is what a queue gives the bridge, whatever its type (``RecordSource``: its offsets, its entries in
memory, where those on disk or a stream's chunks lie, its commit); ``record_stream`` the read, a broker operation
writing an Arrow IPC stream, with ``arrow_records`` (entries to record batches) and ``record_reader`` (the processes
that build batches from the segment files off the event loop); ``commit`` the commit, an operation of the broker.  The
HTTP endpoints in front of them are ``mgmt_http/offsets.py``; the Spark data source that calls those, ``spark/``.
"""
