"""Worker processes: each job runs in a separate process (spawned, so the server never
imports torch), one at a time per worker, under a time limit.

A :class:`WorkerPool` keeps ``workers`` slots. Each slot is a thread in the server that
claims the oldest queued job from the :class:`~zrt_core.serve.store.JobStore`, sends it to
its process and waits: a result or the CLI's one-line error is stored; a job past its time
limit, a cancelled job or a process that died is ended by killing that process and starting
a fresh one, so one bad job cannot take the server down.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from typing import Any

from zrt_core.serve.store import CANCELLED, DONE, FAILED, JobStore

#: How often a waiting slot looks at the clock, the cancel flag and its process (s).
POLL_S = 0.05


def worker_main(conn: Any, server_pid: int, empty: str) -> None:
    """A worker process: offline, warm (plugins loaded, torch imported), then one job at a
    time from ``conn`` until the server goes away. ``empty`` is the pool's empty directory,
    its HuggingFace home (the pool removes it: a worker may be killed at any point)."""
    _die_with_parent()
    if os.getppid() != server_pid:  # the server died while this process started
        return
    # nothing downloaded and no HuggingFace cache read: every model arrives as a config
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_CACHE=empty,
                      HF_HOME=empty)
    from zrt_core.errors import InternalError, ZrtError
    from zrt_core.serve.kinds import request_error, run_job, worker_host
    from zrt_core.serve.sandbox import check_finite

    worker_host()
    try:
        import torch  # noqa: F401  (the capture front-end's import, paid before any job)
    except ImportError:  # pragma: no cover - torch is a dependency of zrt-core
        pass
    conn.send(("ready",))
    while True:
        try:
            kind, payload = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            return

        def progress(done: int, total: int) -> None:
            conn.send(("progress", done, total))

        try:
            result, files = run_job(kind, payload, progress)
            # JSON has no NaN or Infinity: a result holding one is a number zrt cannot
            # stand behind, said as such (and never a response the server cannot encode)
            check_finite(result, "result")
        except ZrtError as exc:
            conn.send(("error", type(exc).__name__, request_error(exc)))
        except Exception as exc:  # a bug in zrt: said as the CLI says it, the server lives on
            message = " ".join(f"{type(exc).__name__}: {exc}".split())
            conn.send(("error", InternalError.__name__, f"zrt: internal error: {message} — "
                       "this is a bug in zrt; report it with the request"))
        else:
            conn.send(("done", result, files))


def _die_with_parent() -> None:
    """Linux: this process is killed when the server is (even by SIGKILL)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:  # pragma: no cover - no glibc
        pass


class WorkerPool:
    """``workers`` processes running the store's queued jobs."""

    def __init__(self, store: JobStore, workers: int, *, job_timeout_s: float) -> None:
        self.store = store
        self.workers = workers
        self.job_timeout_s = job_timeout_s
        self._wake = threading.Condition()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._procs: dict[int, Any] = {}
        self._ctx = multiprocessing.get_context("spawn")
        #: the workers' HuggingFace home: one empty directory for the pool, made by
        #: :meth:`start` and removed by :meth:`stop` (workers are killed, not asked)
        self._hf_home: str | None = None
        #: recent job durations (s), for Retry-After
        self.recent_s: list[float] = []

    def start(self) -> None:
        if self._hf_home is None:  # before any slot thread: one directory for them all
            self._hf_home = tempfile.mkdtemp(prefix="zrt-serve-hf-")
        for slot in range(self.workers):
            t = threading.Thread(target=self._slot, args=(slot,), name=f"zrt-slot-{slot}",
                                 daemon=True)
            t.start()
            self._threads.append(t)

    def notify(self) -> None:
        """A job was queued: wake a waiting slot."""
        with self._wake:
            self._wake.notify()

    def stop(self) -> None:
        self._stop.set()
        with self._wake:
            self._wake.notify_all()
        for proc, _conn in list(self._procs.values()):
            _kill(proc)
        for t in self._threads:
            t.join(timeout=5)
        if self._hf_home is not None:
            shutil.rmtree(self._hf_home, ignore_errors=True)
            self._hf_home = None

    def mean_job_s(self) -> float:
        recent = self.recent_s[-50:]
        return sum(recent) / len(recent) if recent else 1.0

    # -- one slot ---------------------------------------------------------------------------

    def _spawn(self, slot: int) -> tuple[Any, Any]:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=worker_main, args=(child, os.getpid(), self._hf_home),
                                 name=f"zrt-worker-{slot}", daemon=True)
        proc.start()
        child.close()
        self._procs[slot] = (proc, parent)
        return proc, parent

    def _slot(self, slot: int) -> None:
        proc, conn = self._spawn(slot)
        ready = False
        while not self._stop.is_set():
            if not ready:  # the first job waits for the worker's imports, not the queue
                if conn.poll(POLL_S):
                    try:
                        ready = conn.recv() == ("ready",)
                    except (EOFError, OSError):
                        proc, conn = self._respawn(slot, proc)
                elif not proc.is_alive():
                    proc, conn = self._respawn(slot, proc)
                continue
            job = self.store.claim()
            if job is None:
                with self._wake:
                    self._wake.wait(timeout=0.5)
                continue
            keep = self._run(job, proc, conn)
            if not keep:
                proc, conn = self._respawn(slot, proc)
                ready = False

    def _respawn(self, slot: int, proc: Any) -> tuple[Any, Any]:
        _kill(proc)
        return self._spawn(slot)

    def _run(self, job: Any, proc: Any, conn: Any) -> bool:
        """Run one job in ``proc``; False when the process had to be ended."""
        start = time.monotonic()
        try:
            conn.send((job.kind, job.request))
        except (OSError, ValueError):
            self.store.finish(job.id, FAILED, error_type="InternalError",
                              error="zrt: internal error: the worker process was gone before "
                              "the job started — submit it again")
            return False
        next_cancel_check = start
        while True:
            if self._stop.is_set():  # shutting down: the job stays running, and the next
                return False          # start queues it again (JobStore.recover)
            now = time.monotonic()
            if now - start > self.job_timeout_s:
                self.store.finish(job.id, FAILED, error_type="TimeoutError",
                                  error=f"zrt: error: the job ran past the server's time limit "
                                  f"of {self.job_timeout_s:g} s — ask for less (fewer records, "
                                  "the analytic front-end), or raise --job-timeout")
                return False
            if now >= next_cancel_check:
                next_cancel_check = now + 0.25
                if self.store.cancel_requested(job.id):
                    self.store.finish(job.id, CANCELLED, error="cancelled while it ran")
                    return False
            try:
                if not conn.poll(POLL_S):
                    if not proc.is_alive():
                        raise EOFError
                    continue
                message = conn.recv()
            except (EOFError, OSError):
                self.store.finish(job.id, FAILED, error_type="InternalError",
                                  error=f"zrt: internal error: the worker process died "
                                  f"(exit code {proc.exitcode}) running this job — this is a "
                                  "bug in zrt or its memory limit; report it with the request")
                return False
            if message[0] == "progress":
                self.store.progress(job.id, message[1], message[2])
                continue
            if message[0] == "done":
                self.store.finish(job.id, DONE, result=message[1], files=message[2])
            else:
                self.store.finish(job.id, FAILED, error_type=message[1], error=message[2])
            self.recent_s.append(time.monotonic() - start)
            del self.recent_s[:-100]
            return True


def _kill(proc: Any) -> None:
    if proc.is_alive():
        proc.kill()
    proc.join(timeout=5)
