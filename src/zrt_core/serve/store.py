"""The server's jobs in SQLite (standard library ``sqlite3``): what was asked, its state, its
result and its files, so a restart loses nothing.

One connection shared by the server's threads behind a lock (SQLite serialises writers
anyway); WAL journal so a reader never waits on the writer's fsync. A job that was
``running`` when the server stopped is queued again on the next start, or failed with the
reason once it has been interrupted :attr:`JobStore.max_attempts` times.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from attrs import frozen

#: Job states; the last three are final.
QUEUED, RUNNING, DONE, FAILED, CANCELLED = "queued", "running", "done", "failed", "cancelled"
STATES = (QUEUED, RUNNING, DONE, FAILED, CANCELLED)
FINAL = (DONE, FAILED, CANCELLED)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    request TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    body_hash TEXT,
    idempotency_key TEXT UNIQUE,
    result TEXT,
    error TEXT,
    error_type TEXT,
    progress_done INTEGER,
    progress_total INTEGER,
    attempts INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    created_s REAL NOT NULL,
    started_s REAL,
    finished_s REAL,
    seq INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_status ON jobs (status, seq);
CREATE INDEX IF NOT EXISTS jobs_hash ON jobs (request_hash, status);
CREATE INDEX IF NOT EXISTS jobs_body ON jobs (body_hash, status);
CREATE TABLE IF NOT EXISTS files (
    job_id TEXT NOT NULL,
    name TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (job_id, name)
);
"""


@frozen
class JobRow:
    """One job as stored; ``result`` is the parsed JSON the job answered."""

    id: str
    kind: str
    status: str
    request: dict[str, Any]
    request_hash: str
    idempotency_key: str | None
    result: Any
    error: str | None
    error_type: str | None
    progress_done: int | None
    progress_total: int | None
    attempts: int
    cancel_requested: bool
    created_s: float
    started_s: float | None
    finished_s: float | None
    files: tuple[str, ...] = ()


class JobStore:
    """Jobs in one SQLite file (``":memory:"`` for a throwaway store)."""

    def __init__(self, path: str | Path, *, max_attempts: int = 3) -> None:
        self.path = str(path)
        self.max_attempts = max_attempts
        self._lock = threading.RLock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None,
                                   timeout=30.0)
        self._db.row_factory = sqlite3.Row
        if self.path != ":memory:":
            self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- submitting -----------------------------------------------------------------------

    def answered(self, body_hash: str) -> JobRow | None:
        """A finished job whose request body (as sent) had this hash: the stored answer to
        an identical request, found before the request is checked again."""
        with self._lock:
            row = self._db.execute("SELECT * FROM jobs WHERE body_hash = ? AND status = ? "
                                   "AND idempotency_key IS NULL ORDER BY seq DESC LIMIT 1",
                                   (body_hash, DONE)).fetchone()
            return None if row is None else self._row(row)

    def submit(self, kind: str, request: dict[str, Any], request_hash: str, *,
               idempotency_key: str | None = None, max_queued: int | None = None,
               body_hash: str | None = None) -> tuple[JobRow, bool]:
        """``(job, created)``: the job this request already has — same idempotency key, or
        a finished job with the same request hash — or a new queued one.

        :raises QueueFull: ``max_queued`` jobs are already queued.
        :raises KeyConflict: the idempotency key belongs to a different request.
        """
        with self._tx() as db:
            if idempotency_key is not None:
                row = db.execute("SELECT * FROM jobs WHERE idempotency_key = ?",
                                 (idempotency_key,)).fetchone()
                if row is not None:
                    if row["request_hash"] != request_hash or row["kind"] != kind:
                        raise KeyConflict(idempotency_key)
                    return self._row(row), False
            row = db.execute("SELECT * FROM jobs WHERE request_hash = ? AND status = ? "
                             "AND idempotency_key IS NULL ORDER BY seq DESC LIMIT 1",
                             (request_hash, DONE)).fetchone()
            if row is not None and idempotency_key is None:
                return self._row(row), False
            if max_queued is not None:
                queued = db.execute("SELECT COUNT(*) FROM jobs WHERE status = ?",
                                    (QUEUED,)).fetchone()[0]
                if queued >= max_queued:
                    raise QueueFull(queued)
            seq = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs").fetchone()[0]
            job_id = uuid.uuid4().hex
            db.execute("INSERT INTO jobs (id, kind, status, request, request_hash, body_hash, "
                       "idempotency_key, created_s, seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (job_id, kind, QUEUED, json.dumps(request, sort_keys=True),
                        request_hash, body_hash, idempotency_key, time.time(), seq))
            return self._row(db.execute("SELECT * FROM jobs WHERE id = ?",
                                        (job_id,)).fetchone()), True

    # -- the worker side ------------------------------------------------------------------

    def claim(self) -> JobRow | None:
        """The oldest queued job, now ``running`` (None when nothing is queued)."""
        with self._tx() as db:
            row = db.execute("SELECT * FROM jobs WHERE status = ? ORDER BY seq LIMIT 1",
                             (QUEUED,)).fetchone()
            if row is None:
                return None
            db.execute("UPDATE jobs SET status = ?, started_s = ?, attempts = attempts + 1 "
                       "WHERE id = ?", (RUNNING, time.time(), row["id"]))
            return self._row(db.execute("SELECT * FROM jobs WHERE id = ?",
                                        (row["id"],)).fetchone())

    def progress(self, job_id: str, done: int, total: int) -> None:
        with self._tx() as db:
            db.execute("UPDATE jobs SET progress_done = ?, progress_total = ? WHERE id = ? "
                       "AND status = ?", (done, total, job_id, RUNNING))

    def finish(self, job_id: str, status: str, *, result: Any = None, error: str | None = None,
               error_type: str | None = None, files: dict[str, bytes] | None = None) -> None:
        """Record a final state (a job already final stays as it is)."""
        assert status in FINAL
        with self._tx() as db:
            cur = db.execute("UPDATE jobs SET status = ?, result = ?, error = ?, error_type = ?,"
                             " finished_s = ? WHERE id = ? AND status IN (?, ?)",
                             (status, None if result is None else json.dumps(result),
                              error, error_type, time.time(), job_id, QUEUED, RUNNING))
            if cur.rowcount and files:
                db.executemany("INSERT OR REPLACE INTO files (job_id, name, data) "
                               "VALUES (?, ?, ?)",
                               [(job_id, name, data) for name, data in files.items()])

    def cancel(self, job_id: str) -> JobRow | None:
        """Cancel a queued job at once; ask a running one to stop (the pool ends it)."""
        with self._tx() as db:
            db.execute("UPDATE jobs SET status = ?, finished_s = ?, error = ? WHERE id = ? "
                       "AND status = ?", (CANCELLED, time.time(), "cancelled before it ran",
                                          job_id, QUEUED))
            db.execute("UPDATE jobs SET cancel_requested = 1 WHERE id = ? AND status = ?",
                       (job_id, RUNNING))
        return self.get(job_id)

    def cancel_requested(self, job_id: str) -> bool:
        with self._lock:
            row = self._db.execute("SELECT cancel_requested FROM jobs WHERE id = ?",
                                   (job_id,)).fetchone()
        return bool(row and row[0])

    def recover(self) -> tuple[int, int]:
        """After a restart: ``running`` jobs go back to the queue, or fail once interrupted
        :attr:`max_attempts` times; ``(requeued, failed)``."""
        with self._tx() as db:
            db.execute("UPDATE jobs SET status = ?, finished_s = ?, error = 'cancelled while "
                       "it ran' WHERE status = ? AND cancel_requested = 1",
                       (CANCELLED, time.time(), RUNNING))
            failed = db.execute(
                "UPDATE jobs SET status = ?, finished_s = ?, error_type = 'InterruptedError', "
                "error = 'the server stopped while this job ran ' || attempts || ' times — "
                "submit it again, or look for what stops the server' "
                "WHERE status = ? AND attempts >= ?",
                (FAILED, time.time(), RUNNING, self.max_attempts)).rowcount
            requeued = db.execute("UPDATE jobs SET status = ?, started_s = NULL, "
                                  "progress_done = NULL, progress_total = NULL WHERE status = ?",
                                  (QUEUED, RUNNING)).rowcount
        return requeued, failed

    # -- reading --------------------------------------------------------------------------

    def get(self, job_id: str) -> JobRow | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
            return None if row is None else self._row(row)

    def list(self, *, status: str | None = None, kind: str | None = None, limit: int = 100,
             offset: int = 0) -> tuple[list[JobRow], int]:
        """Newest first, and how many match in all."""
        where, args = [], []
        if status is not None:
            where.append("status = ?")
            args.append(status)
        if kind is not None:
            where.append("kind = ?")
            args.append(kind)
        clause = (" WHERE " + " AND ".join(where)) if where else ""
        with self._lock:
            total = self._db.execute(f"SELECT COUNT(*) FROM jobs{clause}", args).fetchone()[0]
            rows = self._db.execute(f"SELECT * FROM jobs{clause} ORDER BY seq DESC "
                                    "LIMIT ? OFFSET ?", [*args, limit, offset]).fetchall()
            return [self._row(r) for r in rows], total

    def count(self, status: str) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM jobs WHERE status = ?",
                                    (status,)).fetchone()[0]

    def file(self, job_id: str, name: str) -> bytes | None:
        with self._lock:
            row = self._db.execute("SELECT data FROM files WHERE job_id = ? AND name = ?",
                                   (job_id, name)).fetchone()
        return None if row is None else bytes(row[0])

    def _row(self, row: sqlite3.Row) -> JobRow:
        names = tuple(r[0] for r in self._db.execute(
            "SELECT name FROM files WHERE job_id = ? ORDER BY name", (row["id"],)))
        return JobRow(
            id=row["id"], kind=row["kind"], status=row["status"],
            request=json.loads(row["request"]), request_hash=row["request_hash"],
            idempotency_key=row["idempotency_key"],
            result=None if row["result"] is None else json.loads(row["result"]),
            error=row["error"], error_type=row["error_type"],
            progress_done=row["progress_done"], progress_total=row["progress_total"],
            attempts=row["attempts"], cancel_requested=bool(row["cancel_requested"]),
            created_s=row["created_s"], started_s=row["started_s"],
            finished_s=row["finished_s"], files=names)


class QueueFull(Exception):
    """The queue holds its limit of jobs."""

    def __init__(self, queued: int) -> None:
        super().__init__(f"{queued} jobs queued")
        self.queued = queued


class KeyConflict(Exception):
    """An idempotency key reused for a different request."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key
