def walk_records(
    data: bytes | bytearray | memoryview,
    start: int,
    end: int,
    count: int,
    keyless: list[int] | None = None,
    /,
) -> tuple[int, int]: ...
