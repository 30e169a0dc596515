"""A Python client for ``zrt serve`` (httpx; no torch): submit a job, wait for it, read its
result and files. Needs the ``zrt-core[serve]`` extra (httpx).

>>> from zrt_core.client import Client
>>> with Client("http://127.0.0.1:8000") as zrt:          # doctest: +SKIP
...     result = zrt.estimate({"model": "llama3-8b", "hardware": "h100",
...                            "infer": {"input_len": 1024, "output_len": 128}})

A refused request or a failed job raises :class:`ServerError` carrying the server's one-line
message (the CLI's).
"""

from __future__ import annotations

import os
import time
from typing import Any

from zrt_core.errors import ZrtError

FINAL = ("done", "failed", "cancelled")


class ServerError(ZrtError):
    """The server refused a request, or a job did not finish with a result."""

    def __init__(self, message: str, hint: str | None = None, *, status: int | None = None
                 ) -> None:
        super().__init__(message, hint)
        self.status = status


class Client:
    """A ``zrt serve`` at ``url``; ``token`` defaults to ``$ZRT_TOKEN``."""

    def __init__(self, url: str, *, token: str | None = None, timeout_s: float = 60.0
                 ) -> None:
        try:
            import httpx
        except ImportError:
            raise ZrtError("the zrt client needs httpx",
                           "pip install 'zrt-core[serve]'") from None
        token = token if token is not None else os.environ.get("ZRT_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)
        self._transport_error = httpx.TransportError

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- requests -----------------------------------------------------------------------

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except self._transport_error as exc:
            raise ServerError(f"cannot reach the zrt server at {self.url} ({exc})",
                              "start it with `zrt serve`, or check --server") from None
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail") or response.text
            except ValueError:
                detail = response.text
            detail = " ".join(str(detail).split()).removeprefix("zrt: error: ")
            raise ServerError(detail, status=response.status_code)
        return response

    def submit(self, kind: str, body: dict[str, Any], *, idempotency_key: str | None = None,
               params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Queue a job (``kind``: estimate, capture, validate); the job as first answered."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._call("POST", f"/v1/{kind}", json=body, headers=headers,
                          params=params).json()

    def job(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{job_id}").json()

    def jobs(self, **filters: Any) -> dict[str, Any]:
        return self._call("GET", "/v1/jobs", params=filters).json()

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._call("DELETE", f"/v1/jobs/{job_id}").json()

    def file(self, job_id: str, name: str) -> bytes:
        """``report.html``, ``trace.json`` or ``results.csv`` of a job that made it."""
        return self._call("GET", f"/v1/jobs/{job_id}/{name}").content

    def wait(self, job_id: str, *, timeout_s: float = 600.0, poll_s: float = 0.05
             ) -> dict[str, Any]:
        """The job once final; a failed or cancelled job raises :class:`ServerError`."""
        deadline = time.monotonic() + timeout_s
        job = self.job(job_id)
        while job["status"] not in FINAL:
            if time.monotonic() > deadline:
                raise ServerError(f"job {job_id} still {job['status']} after {timeout_s:g} s",
                                  "wait longer, or DELETE the job")
            time.sleep(poll_s)
            poll_s = min(poll_s * 1.5, 1.0)
            job = self.job(job_id)
        if job["status"] != "done":
            message = (job.get("error") or job["status"]).removeprefix("zrt: error: ")
            raise ServerError(message)
        return job

    def run(self, kind: str, body: dict[str, Any], **kwargs: Any) -> Any:
        """Submit and wait: the job's result (what the CLI's ``--json`` prints)."""
        params = kwargs.pop("params", None)
        key = kwargs.pop("idempotency_key", None)
        job = self.submit(kind, body, idempotency_key=key, params=params)
        return self.wait(job["id"], **kwargs)["result"]

    def estimate(self, spec: dict[str, Any], **kwargs: Any) -> Any:
        """``zrt estimate --json`` for a spec document (docs/estimate.md) as a mapping."""
        return self.run("estimate", spec, **kwargs)

    def capture(self, model: Any, **options: Any) -> Any:
        return self.run("capture", {"model": model, **options})

    def validate(self, records: list[dict[str, Any]], **options: Any) -> Any:
        return self.run("validate", {"records": records, **options})

    def hardware(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/hardware").json()["hardware"]

    def models(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/models").json()["models"]

    def plugins(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/plugins").json()["plugins"]

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/healthz").json()
