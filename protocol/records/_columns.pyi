def record_columns(
    records: bytes | bytearray | memoryview,
    count: int,
    base_offset: int,
    base_timestamp: int,
    log_append_time: int | None,
    first: int,
    last: int,
    /,
) -> tuple[int, bytes, bytes, bytes | None, bytes, bytes, bytes | None, bytes, bytes]: ...
