"""The server's tests run a real ``zrt serve`` on 127.0.0.1 in a subprocess; they are
skipped where the serve extra (fastapi, uvicorn, httpx) is not installed, as in the
core-alone nox session (each test module calls ``pytest.importorskip``; nothing here
imports them at collection time)."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``zrt serve`` on a free port with its own database; :meth:`kill` is SIGKILL."""

    def __init__(self, db: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = db.with_suffix(f".{self.port}.log")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "zrt_core.cli.main", "serve", "--port", str(self.port),
             "--db", str(db), *args],
            stdout=self.log.open("wb"), stderr=subprocess.STDOUT,
            # temporary files beside the database: a server killed with SIGKILL cannot
            # remove its workers' directory, and a test run must not litter /tmp
            env={**os.environ, "TMPDIR": str(db.parent), **(env or {})})

    def wait_ready(self, timeout_s: float = 60.0) -> float:
        """Seconds until /healthz answers."""
        import httpx

        start = time.perf_counter()
        while time.perf_counter() - start < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"zrt serve exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1.0).status_code == 200:
                    return time.perf_counter() - start
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError(f"zrt serve not ready in {timeout_s} s: {self.log.read_text()}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


def wait_final(client: Any, job_id: str, timeout_s: float = 120.0) -> dict:
    start = time.perf_counter()
    while time.perf_counter() - start < timeout_s:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in ("done", "failed", "cancelled"):
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} not final in {timeout_s} s: {job}")


@pytest.fixture
def server_factory(tmp_path: Path):
    """``start(*args, db=None, env=None)`` → a ready :class:`Server`; every one is killed
    at the end of the test."""
    started: list[Server] = []

    def start(*args: str, db: Path | None = None, env: dict[str, str] | None = None
              ) -> Server:
        server = Server(db or tmp_path / "jobs.sqlite", *args, env=env)
        started.append(server)
        server.wait_ready()
        return server

    yield start
    for server in started:
        server.kill()


@pytest.fixture(scope="session")
def server_class():
    return Server


@pytest.fixture
def final():
    return wait_final
