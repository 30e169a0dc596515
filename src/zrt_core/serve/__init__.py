"""``zrt serve``: the CLI as an HTTP API with persistent jobs (FastAPI, uvicorn, SQLite),
installed with the ``zrt-core[serve]`` extra; see docs/serve.md. The application is
:func:`zrt_core.serve.app.create_app`; the job store (:mod:`zrt_core.serve.store`) needs
only the standard library."""
