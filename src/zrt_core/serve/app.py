"""The FastAPI application of ``zrt serve``: endpoints mirroring the CLI, jobs in SQLite,
worker processes, limits (queue, body size, time), an optional bearer token and problem
details for every error (docs/serve.md)."""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import threading
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from attrs import frozen
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from zrt_core import __version__
from zrt_core.errors import InternalError, ZrtError
from zrt_core.serve import models as m
from zrt_core.serve.kinds import KINDS, JobKind, PrepareContext, request_error
from zrt_core.serve.sandbox import RequestRefused
from zrt_core.serve.store import QUEUED, RUNNING, STATES, JobRow, JobStore, KeyConflict, QueueFull
from zrt_core.serve.workers import WorkerPool

PROBLEM = "application/problem+json"
#: Files a job may have made, and their media types.
FILE_TYPES = {"report.html": "text/html", "trace.json": "application/json",
              "results.csv": "text/csv", "report.json": "application/json"}


@frozen
class ServeSettings:
    """What ``zrt serve`` was started with (docs/serve.md lists the defaults' reasons)."""

    db: str = "zrt-jobs.sqlite"
    workers: int = 2
    model_dir: Path | None = None
    token: str | None = None
    max_queue: int = 64
    job_timeout_s: float = 600.0
    max_body_bytes: int = 1 << 20
    max_attempts: int = 3
    #: start the workers and load the plugins only when ``app.state.zrt_start()`` is called
    #: (``zrt serve`` calls it once the port is open, so nothing slows the start)
    defer_start: bool = False


class ApiError(Exception):
    def __init__(self, status: int, title: str, detail: str, *, type_: str = "about:blank",
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.title, self.detail = status, title, detail
        self.type, self.headers = type_, headers or {}


def problem(status: int, title: str, detail: str, *, type_: str = "about:blank",
            headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"type": type_, "title": title, "status": status, "detail": detail},
                        status_code=status, media_type=PROBLEM, headers=headers)


def _problem_doc(description: str) -> dict[str, Any]:
    return {"description": description, "content": {PROBLEM: {"schema": m.Problem.model_json_schema()}}}


def _responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    what = {401: "missing or wrong bearer token", 403: "the request names a file outside the "
            "model directory, or remote code", 404: "no such job or file",
            409: "the Idempotency-Key belongs to another request", 413: "the body is over the "
            "size limit", 422: "bad input: the CLI's one-line message",
            429: "the queue is full; retry after Retry-After seconds"}
    out: dict[int | str, dict[str, Any]] = {c: _problem_doc(what[c]) for c in (401, *codes)}
    if 429 in codes:
        out[429]["headers"] = {"Retry-After": {"schema": {"type": "integer"},
                                               "description": "seconds"}}
    return out


class _Host:
    """The plugin host, loaded in a thread after the port opens (a cold start stays fast)."""

    def __init__(self) -> None:
        self._host: Any = None
        self.versions: list[tuple[str, str]] = []
        self._error: BaseException | None = None
        self._done = threading.Event()

    def load(self) -> None:
        try:
            from zrt_core.plugins import get_plugin_manager

            host = get_plugin_manager()
            list(host.models)
            list(host.hardware)
            self.versions = sorted((i.name, i.version) for i in host.plugin_infos())
            self._host = host
        except BaseException as exc:  # reported on every request that needs it
            self._error = exc
        finally:
            self._done.set()

    def get(self) -> Any:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._host


class _BodyLimit:
    """ASGI middleware: a body over ``limit`` bytes is a 413 before any handler reads it."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or ()).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await _send(send, problem(413, "Content Too Large", self._detail()))
            return
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.limit:
                await _send(send, problem(413, "Content Too Large", self._detail()))
                return
        body, sent = b"".join(chunks), False

        async def replay() -> Any:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _detail(self) -> str:
        return (f"zrt: error: the request body is over the server's limit of {self.limit:,} "
                "bytes — send less (fewer records), or raise --max-body-bytes")


class _Bearer:
    """ASGI middleware: every path but /healthz needs ``Authorization: Bearer TOKEN``."""

    def __init__(self, app: Any, token: str) -> None:
        self.app, self.token = app, token.encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] != "/healthz":
            given = dict(scope.get("headers") or ()).get(b"authorization", b"")
            scheme, _, token = given.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(),
                                                                       self.token):
                await _send(send, problem(
                    401, "Unauthorized", "zrt: error: this server needs a bearer token — "
                    "send 'Authorization: Bearer TOKEN' (the server's --token / ZRT_TOKEN)",
                    headers={"WWW-Authenticate": "Bearer"}))
                return
        await self.app(scope, receive, send)


async def _send(send: Any, response: JSONResponse) -> None:
    await send({"type": "http.response.start", "status": response.status_code,
                "headers": response.raw_headers})
    await send({"type": "http.response.body", "body": response.body})


def create_app(settings: ServeSettings) -> FastAPI:
    host = _Host()
    store_box: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        store = JobStore(settings.db, max_attempts=settings.max_attempts)
        store.recover()
        pool = WorkerPool(store, settings.workers, job_timeout_s=settings.job_timeout_s)
        store_box.update(store=store, pool=pool)
        started: list[bool] = []

        def start() -> None:
            if not started:
                started.append(True)
                threading.Thread(target=host.load, name="zrt-host", daemon=True).start()
                pool.start()

        app.state.zrt_start = start
        if not settings.defer_start:
            start()
        yield
        pool.stop()
        store.close()

    app = FastAPI(title="zrt", version=__version__, lifespan=lifespan,
                  description="Predict step time, memory and cost of training or serving an "
                  "LLM: the zrt CLI as an HTTP API with persistent jobs (docs/serve.md).")
    app.add_middleware(_BodyLimit, limit=settings.max_body_bytes)
    if settings.token:
        app.add_middleware(_Bearer, token=settings.token)

    def store() -> JobStore:
        return store_box["store"]

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return problem(exc.status, exc.title, exc.detail, type_=exc.type, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "request"
        detail = " ".join(str(first.get("msg", "invalid request")).split())
        more = len(exc.errors()) - 1
        return problem(422, "Unprocessable Content", f"zrt: error: {where}: {detail}"
                       + (f" (and {more} more)" if more > 0 else "")
                       + " — see /docs for the request schema")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return problem(exc.status_code, _title(exc.status_code),
                       f"zrt: error: {exc.detail}", headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        return problem(500, "Internal Server Error", "zrt: internal error: "
                       f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]} — this is a "
                       "bug in zrt; report it with the request")

    @app.get("/healthz", response_model=m.Health, tags=["server"])
    def healthz() -> m.Health:
        """Liveness: always answers, no token needed."""
        s = store()
        return m.Health(status="ok", version=__version__, workers=settings.workers,
                        queued=s.count(QUEUED), running=s.count(RUNNING))

    @app.get("/v1/hardware", response_model=m.HardwareList, responses=_responses(),
             tags=["registry"])
    def hardware() -> m.HardwareList:
        """Every installed hardware spec (``zrt hw list --json``)."""
        from zrt_core.hardware import spec_summary

        h = host.get()
        specs = sorted(h.hardware, key=lambda s: (s.vendor, s.id))
        return m.HardwareList(hardware=[
            {**spec_summary(s), "distribution": h.hardware.distribution_of(s.id)}
            for s in specs])

    @app.get("/v1/models", response_model=m.ModelList, responses=_responses(),
             tags=["registry"])
    def models() -> m.ModelList:
        """The bundled model configs with parameter counts (``zrt models --json``)."""
        from zrt_core.analytic.catalog import model_rows

        return m.ModelList(models=_cached(app, "models", lambda: model_rows(host.get())))

    @app.get("/v1/plugins", response_model=m.PluginList, responses=_responses(),
             tags=["registry"])
    def plugins() -> m.PluginList:
        """Installed plugins and what each contributes (``zrt plugins --json``)."""
        return m.PluginList(plugins=[i.to_json() for i in host.get().plugin_infos()])

    for kind in KINDS.values():
        _add_submit(app, kind, settings, host, store, store_box)

    @app.get("/v1/jobs", response_model=m.JobList, responses=_responses(422),
             tags=["jobs"])
    def list_jobs(status: str | None = Query(None, description=", ".join(STATES)),
                  kind: str | None = Query(None, max_length=64),
                  limit: int = Query(100, ge=1, le=1000),
                  offset: int = Query(0, ge=0, le=1 << 40)) -> m.JobList:
        """Jobs, newest first (no results: GET the job for those)."""
        if status is not None and status not in STATES:
            raise ApiError(422, "Unprocessable Content", f"zrt: error: status: unknown state "
                           f"{status!r} — use one of {', '.join(STATES)}")
        rows, total = store().list(status=status, kind=kind, limit=limit, offset=offset)
        return m.JobList(jobs=[_summary(r) for r in rows], total=total)

    @app.get("/v1/jobs/{job_id}", response_model=m.Job, responses=_responses(404),
             tags=["jobs"])
    def get_job(job_id: str) -> m.Job:
        """One job: its state, progress, and once done its result."""
        return _job(_find(store(), job_id))

    @app.delete("/v1/jobs/{job_id}", response_model=m.Job, responses=_responses(404),
                tags=["jobs"])
    def cancel_job(job_id: str) -> m.Job:
        """Cancel: a queued job at once, a running one by ending its worker (a finished job
        is answered as it is)."""
        _find(store(), job_id)
        return _job(store().cancel(job_id))

    for name, media in (("report.html", "text/html"), ("trace.json", "application/json"),
                        ("results.csv", "text/csv")):
        _add_file_route(app, name, media, store)
    return app


def _add_submit(app: FastAPI, kind: JobKind, settings: ServeSettings, host: _Host,
                store: Any, box: dict[str, Any]) -> None:
    model = kind.request_model
    with_files = kind.name == "estimate"

    def submit(body: Any, request: Request, files: bool = False) -> Response:
        # a spec document keeps only what the client sent (its parser supplies defaults);
        # other kinds get every field, defaults filled in
        data = body.model_dump(exclude_unset=kind.as_sent)
        if with_files:
            data["files"] = files
        key = request.headers.get("idempotency-key")
        if key is not None and not 1 <= len(key) <= 200:
            raise ApiError(422, "Unprocessable Content", "zrt: error: Idempotency-Key must "
                           "be 1 to 200 characters — send a short unique key, e.g. a UUID")
        h = host.get()
        body_hash = _hash(kind.name, data, host.versions)
        if key is None:  # an identical body already answered: no need to check it again
            stored = store().answered(body_hash)
            if stored is not None:
                return JSONResponse(_job(stored).model_dump(mode="json"), status_code=200)
        ctx = PrepareContext(host=h, model_dir=settings.model_dir)
        try:
            payload = kind.prepare(dict(data), ctx)
        except RequestRefused as exc:
            raise ApiError(403, "Forbidden", request_error(exc), type_="zrt:RequestRefused"
                           ) from None
        except InternalError:
            raise
        except ZrtError as exc:
            raise ApiError(422, "Unprocessable Content", request_error(exc),
                           type_=f"zrt:{type(exc).__name__}") from None
        digest = _hash(kind.name, payload, host.versions)
        try:
            row, created = store().submit(
                kind.name, payload, digest, idempotency_key=key, max_queued=settings.max_queue,
                body_hash=None if ctx.files_read else body_hash)
        except QueueFull as exc:
            pool = box["pool"]
            wait_s = max(1, min(300, math.ceil(exc.queued * pool.mean_job_s()
                                               / max(1, settings.workers))))
            raise ApiError(429, "Too Many Requests", f"zrt: error: the queue holds its limit "
                           f"of {settings.max_queue} jobs — retry after {wait_s} s",
                           headers={"Retry-After": str(wait_s)}) from None
        except KeyConflict:
            raise ApiError(409, "Conflict", "zrt: error: this Idempotency-Key was used for a "
                           "different request — send a new key for a new request") from None
        if created:
            box["pool"].notify()
        return JSONResponse(_job(row).model_dump(mode="json"),
                            status_code=202 if created else 200)

    submit.__annotations__["body"] = model
    submit.__name__ = f"submit_{kind.name}"
    submit.__doc__ = (f"Queue a job: {kind.summary}. Answers the job ({{'id': ...}}); 200 "
                      "with the stored job when the same request (or Idempotency-Key) has "
                      "one, 202 when it is new.")
    responses = _responses(403, 409, 413, 422, 429)
    responses[202] = {"description": "queued", "model": m.Job}
    app.post(f"/v1/{kind.name}", response_model=m.Job, responses=responses,
             tags=["jobs"])(submit)


def _add_file_route(app: FastAPI, name: str, media: str, store: Any) -> None:
    def get_file(job_id: str) -> Response:
        _find(store(), job_id)
        data = store().file(job_id, name)
        if data is None:
            raise ApiError(404, "Not Found", f"zrt: error: job {job_id} made no {name} — "
                           "GET the job: 'files' lists what it made (estimate with "
                           "?files=true makes report.html and trace.json)")
        return Response(data, media_type=media)

    get_file.__name__ = f"get_{name.replace('.', '_')}"
    get_file.__doc__ = f"The job's {name}, where it made one."
    app.get(f"/v1/jobs/{{job_id}}/{name}", response_class=Response, tags=["jobs"],
            responses={200: {"content": {media: {}}, "description": name},
                       **_responses(404)})(get_file)


def _find(store: JobStore, job_id: str) -> JobRow:
    row = store.get(job_id)
    if row is None:
        raise ApiError(404, "Not Found", f"zrt: error: no job {job_id!r} — GET /v1/jobs "
                       "lists the jobs")
    return row


def _progress(row: JobRow) -> m.Progress | None:
    if row.progress_total is None:
        return None
    return m.Progress(done=row.progress_done or 0, total=row.progress_total)


def _job(row: JobRow) -> m.Job:
    return m.Job(id=row.id, kind=row.kind, status=row.status, request=row.request,
                 result=row.result, error=row.error, error_type=row.error_type,
                 progress=_progress(row), attempts=row.attempts, created_s=row.created_s,
                 started_s=row.started_s, finished_s=row.finished_s, files=list(row.files))


def _summary(row: JobRow) -> m.JobSummary:
    return m.JobSummary(id=row.id, kind=row.kind, status=row.status, error=row.error,
                        progress=_progress(row), created_s=row.created_s,
                        finished_s=row.finished_s)


def _hash(kind: str, payload: dict[str, Any], versions: list[tuple[str, str]]) -> str:
    """Same kind, same request, same zrt and plugins: the same answer."""
    text = json.dumps({"kind": kind, "payload": payload, "zrt": __version__,
                       "plugins": versions}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _cached(app: FastAPI, key: str, make: Any) -> Any:
    cache = app.state.__dict__.setdefault("_zrt_cache", {})
    if key not in cache:
        cache[key] = make()
    return cache[key]


def _title(status: int) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"
