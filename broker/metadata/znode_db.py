"""`ZnodeDatabase`: where an `InProcessZooKeeper` keeps its persistent znodes, in SQLite.

One table of znodes (path, data, version, creating and last modifying transaction,
child version) and one of counters. Every batch of writes is one SQLite transaction
in WAL mode with `synchronous=FULL`: when `write` returns, the batch is on disk whole
or, on an error (ENOSPC, EIO), not at all. Ephemeral znodes are never stored: they die
with their session, and a restart has no sessions.

The `epoch` counter grows by one at each open: transaction ids are `epoch << 32 | n`,
so they never repeat across restarts (brokers use the creating transaction of their
registration as their broker epoch). Calls block: the store runs them in one worker
thread, never on the event loop.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS znodes (
    path TEXT PRIMARY KEY,
    data BLOB NOT NULL,
    version INTEGER NOT NULL,
    czxid INTEGER NOT NULL,
    mzxid INTEGER NOT NULL,
    cversion INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


@dataclass(frozen=True, slots=True)
class StoredZnode:
    path: str
    data: bytes
    version: int
    czxid: int
    mzxid: int
    cversion: int


# A write: a znode as it now is, or the path of one deleted.
Write = StoredZnode | str


class ZnodeDatabase:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._db: sqlite3.Connection | None = None

    def open(self) -> tuple[int, list[StoredZnode]]:
        """Open (creating it if new); the next epoch, and every stored znode."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.executescript(_SCHEMA)
            db.execute("BEGIN IMMEDIATE")
            row = db.execute("SELECT value FROM counters WHERE name = 'epoch'").fetchone()
            epoch = (row[0] if row else 0) + 1
            db.execute("INSERT OR REPLACE INTO counters VALUES ('epoch', ?)", (epoch,))
            db.execute("COMMIT")
            rows = db.execute(
                "SELECT path, data, version, czxid, mzxid, cversion FROM znodes ORDER BY path"
            ).fetchall()
        except BaseException:
            db.close()
            raise
        self._db = db
        return epoch, [StoredZnode(*row) for row in rows]

    def write(self, writes: list[Write]) -> None:
        """Apply `writes` in one transaction; raises (and applies nothing) if it fails."""
        db = self._db
        assert db is not None, "write before open"
        db.execute("BEGIN IMMEDIATE")
        try:
            for w in writes:
                if isinstance(w, str):
                    db.execute("DELETE FROM znodes WHERE path = ?", (w,))
                else:
                    db.execute(
                        "INSERT OR REPLACE INTO znodes VALUES (?, ?, ?, ?, ?, ?)",
                        (w.path, w.data, w.version, w.czxid, w.mzxid, w.cversion),
                    )
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
