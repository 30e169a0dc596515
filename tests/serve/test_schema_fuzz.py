"""schemathesis against the live ``/openapi.json`` of a real server: every operation, at
least 1,000 generated requests in all, no 5xx, every response valid against its schema
(status code, content type, headers, body). Bounded by count (:data:`EXAMPLES` per
operation) and by time (:data:`DEADLINE_S` for the whole run)."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
schemathesis = pytest.importorskip("schemathesis")
requests = pytest.importorskip("requests")  # schemathesis' own transport

#: Generated cases per operation: 13 operations (an operation whose inputs run out —
#: /healthz has none — stops early), so the submit and job endpoints carry the count;
#: validate's lists of records are the slowest to generate, so it gets fewer.
EXAMPLES = 130
FEWER = {"POST /v1/validate": 60}
#: The least number of requests the run must send.
MIN_REQUESTS = 1000
#: Wall-clock bound of the generation (s): a slow machine sends fewer, and fails loudly.
DEADLINE_S = 150.0


def test_every_endpoint_answers_valid_responses_and_no_5xx(server_factory, tmp_path):
    from hypothesis import HealthCheck, Phase, given, settings
    from schemathesis import checks

    models = tmp_path / "models"
    models.mkdir()
    srv = server_factory("--workers", "1", "--max-queue", "8", "--model-dir", str(models))
    schema = schemathesis.openapi.from_url(srv.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 13
    wanted = [checks.not_a_server_error, checks.status_code_conformance,
              checks.content_type_conformance, checks.response_headers_conformance,
              checks.response_schema_conformance]
    sent: dict[str, int] = {}
    start = time.perf_counter()
    session = requests.Session()
    def fuzz(op, label: str):
        @settings(max_examples=FEWER.get(label, EXAMPLES), deadline=None, database=None, derandomize=True,
                  phases=[Phase.explicit, Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy())
        def run(case):
            if time.perf_counter() - start > DEADLINE_S:
                return
            response = case.call(base_url=srv.url, session=session, timeout=30)
            sent[label] += 1
            case.validate_response(response, checks=wanted)

        run()

    for op in operations:
        label = f"{op.method.upper()} {op.path}"
        sent[label] = 0
        fuzz(op, label)
    total = sum(sent.values())
    assert total >= MIN_REQUESTS, (total, sent)
    assert all(sent.values()), sent
