"""``zrt serve`` over real HTTP: results equal the library's (what ``--json`` prints), stored
answers and Idempotency-Key, the model sandbox, the limits and the token."""

from __future__ import annotations

import json
import os

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

ESTIMATE = {"model": "llama3-8b", "hardware": "nvidia_h100_sxm", "parallel": {"tp": 1},
            "infer": {"input_len": 512, "output_len": 64, "batch": 8}}
#: a tiny llama config, written under the model directory
TINY = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 1024, "max_position_embeddings": 4096}


@pytest.fixture(scope="module")
def models_root(tmp_path_factory):
    """A model directory (one good config, one with auto_map, a symlink out) and a folder
    outside it that holds a config a request must not reach."""
    base = tmp_path_factory.mktemp("serve")
    root, outside = base / "models", base / "outside"
    (root / "tiny").mkdir(parents=True)
    (root / "tiny" / "config.json").write_text(json.dumps(TINY))
    (root / "remote").mkdir()
    (root / "remote" / "config.json").write_text(json.dumps(
        {**TINY, "auto_map": {"AutoConfig": "configuration_x.XConfig"}}))
    outside.mkdir()
    (outside / "config.json").write_text(json.dumps(TINY))
    os.symlink(outside, root / "escape")
    return base


@pytest.fixture(scope="module")
def server(models_root, server_class):
    srv = server_class(models_root / "jobs.sqlite", "--workers", "1", "--model-dir",
                 str(models_root / "models"))
    srv.wait_ready()
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def test_an_estimate_job_answers_what_the_library_answers(client, final):
    from zrt_core.analytic.spec import EstimateSpec
    from zrt_core.estimate.from_spec import estimate_from_spec
    from zrt_core.plugins import get_plugin_manager

    r = client.post("/v1/estimate", json=ESTIMATE)
    assert r.status_code in (200, 202), r.text
    job = final(client, r.json()["id"])
    assert job["status"] == "done", job
    spec = EstimateSpec.from_mapping(dict(ESTIMATE), where="request")
    host = get_plugin_manager()
    report = estimate_from_spec(spec, host, host.hardware_spec(spec.hardware))
    expected = json.loads(json.dumps({"spec": spec.to_json(), **report.to_json()}))
    # everything but the wall-clock timings of the two runs, and the name of the TP plan's
    # source: config_tp_plan names transformers' plan only where transformers is already
    # imported (this test process may have run captures; the worker has not)
    assert job["result"].pop("timings_s").keys() == expected.pop("timings_s").keys()
    plans = {job["result"]["params"].pop("tp_plan"), expected["params"].pop("tp_plan")}
    assert plans <= {"module-name rules", "llama base_model_tp_plan (transformers)"}
    assert job["result"] == expected
    # the same request again is answered from the stored result: the same job, at once
    again = client.post("/v1/estimate", json=ESTIMATE)
    assert again.status_code == 200 and again.json()["id"] == job["id"]


def test_idempotency_key_returns_the_same_job_and_refuses_another_body(client):
    body = {**ESTIMATE, "infer": {**ESTIMATE["infer"], "batch": 3}}
    first = client.post("/v1/estimate", json=body, headers={"Idempotency-Key": "k-1"})
    second = client.post("/v1/estimate", json=body, headers={"Idempotency-Key": "k-1"})
    assert first.status_code == 202 and second.status_code == 200
    assert first.json()["id"] == second.json()["id"]
    other = client.post("/v1/estimate", json=ESTIMATE, headers={"Idempotency-Key": "k-1"})
    assert other.status_code == 409
    assert other.headers["content-type"] == "application/problem+json"


def test_bad_input_is_a_422_with_the_clis_message(client):
    from zrt_core.analytic.spec import EstimateSpec
    from zrt_core.errors import ZrtError

    body = {**ESTIMATE, "infer": {"input_len": 512, "output_len": 64, "input_lenn": 1}}
    with pytest.raises(ZrtError) as cli:
        EstimateSpec.from_mapping(body, where="request")
    r = client.post("/v1/estimate", json=body)
    assert r.status_code == 422
    problem = r.json()
    assert problem["detail"] == "zrt: error: " + " ".join(str(cli.value).split())
    assert problem["status"] == 422 and problem["type"] == "zrt:SpecError"
    unknown = client.post("/v1/estimate", json={**ESTIMATE, "hardware": "no_such_gpu"})
    assert unknown.status_code == 422 and "zrt hw list" in unknown.json()["detail"]
    assert client.get("/v1/jobs/nope").status_code == 404


@pytest.mark.parametrize("name", ["../outside", "../outside/config.json",
                                  "escape", "escape/config.json", "tiny/../../outside",
                                  "/etc/passwd", "remote"])
def test_names_outside_the_model_dir_and_remote_code_are_refused(client, name):
    r = client.post("/v1/estimate", json={**ESTIMATE, "model": name})
    assert r.status_code == 403, r.text
    assert r.json()["detail"].startswith("zrt: error: model: ")


def test_inline_auto_map_is_refused_and_a_config_in_the_dir_runs(client, final):
    inline = {**ESTIMATE, "model": {"config": {**TINY, "auto_map": {"AutoModel": "x.Y"}}}}
    assert client.post("/v1/estimate", json=inline).status_code == 403
    capture = {"model": {**TINY, "auto_map": {"AutoModel": "x.Y"}}, "phases": ["prefill"]}
    assert client.post("/v1/capture", json=capture).status_code == 403
    r = client.post("/v1/estimate", json={**ESTIMATE, "model": "tiny"}, params={
        "files": "true"})
    assert r.status_code == 202, r.text
    job = final(client, r.json()["id"])
    assert job["status"] == "done", job
    assert job["result"]["spec"]["model"] == "tiny"
    assert {"report.html", "trace.json"} <= set(job["files"])
    html = client.get(f"/v1/jobs/{job['id']}/report.html")
    assert html.status_code == 200 and html.text.lstrip().lower().startswith("<!doctype html")
    assert client.get(f"/v1/jobs/{job['id']}/results.csv").status_code == 404


def test_a_validate_job_reports_progress_and_a_csv(client, final):
    import yaml

    from zrt_core.validate import suite_path

    records = [r for r in yaml.safe_load(suite_path("public").read_text())
               if r.get("workload") == "infer"][:2]
    r = client.post("/v1/validate", json={"records": records, "frontend": "analytic"})
    assert r.status_code == 202, r.text
    job = final(client, r.json()["id"])
    assert job["status"] == "done", job
    assert job["progress"] == {"done": 2, "total": 2}
    assert [rec["id"] for rec in job["result"]["records"]] == [rec["id"] for rec in records]
    csv = client.get(f"/v1/jobs/{job['id']}/results.csv")
    assert csv.status_code == 200 and csv.text.startswith("id,status,workload")
    assert client.post("/v1/validate", json={"records": "x"}).status_code == 422


def test_registries_and_job_listing(client):
    from zrt_core.analytic.catalog import model_rows
    from zrt_core.plugins import get_plugin_manager

    assert client.get("/v1/models").json()["models"] == json.loads(json.dumps(
        model_rows(get_plugin_manager())))
    ids = {h["id"] for h in client.get("/v1/hardware").json()["hardware"]}
    assert "nvidia_h100_sxm" in ids
    assert client.get("/v1/plugins").json()["plugins"]
    listing = client.get("/v1/jobs", params={"status": "done"}).json()
    assert listing["total"] >= 1 and all(j["status"] == "done" for j in listing["jobs"])
    assert client.get("/v1/jobs", params={"status": "bogus"}).status_code == 422


def test_a_body_over_the_limit_is_413(server_factory):
    srv = server_factory("--workers", "1", "--max-body-bytes", "2000")
    r = httpx.post(srv.url + "/v1/validate", json={"records": [{"id": "x" * 3000}]})
    assert r.status_code == 413 and "--max-body-bytes" in r.json()["detail"]


def test_the_token_guards_everything_but_healthz(server_factory):
    srv = server_factory("--workers", "1", env={"ZRT_TOKEN": "s3cret"})
    assert httpx.get(srv.url + "/healthz").status_code == 200
    for path in ("/v1/models", "/v1/jobs", "/openapi.json"):
        r = httpx.get(srv.url + path)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert httpx.get(srv.url + "/v1/jobs", headers={"Authorization": "Bearer wrong"}
                     ).status_code == 401
    assert httpx.get(srv.url + "/v1/jobs", headers={"Authorization": "Bearer s3cret"}
                     ).status_code == 200


def test_a_full_queue_is_429_and_a_slow_job_fails_at_the_time_limit(server_factory, final):
    # one worker, still importing when the jobs arrive: the first job waits in the queue
    srv = server_factory("--workers", "1", "--max-queue", "1", "--job-timeout", "0.001")
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        first = c.post("/v1/estimate", json=ESTIMATE)
        assert first.status_code == 202
        full = c.post("/v1/estimate", json={**ESTIMATE, "hardware": "nvidia_a100_sxm_80g"})
        assert full.status_code == 429
        assert int(full.headers["retry-after"]) >= 1
        # no estimate finishes in a millisecond: the job fails, the worker is replaced
        job = final(c, first.json()["id"])
        assert job["status"] == "failed" and "--job-timeout" in job["error"]
        cancel = c.post("/v1/estimate", json={**ESTIMATE, "hardware": "nvidia_a100_sxm_80g"})
        assert cancel.status_code == 202
        cancelled = c.delete(f"/v1/jobs/{cancel.json()['id']}").json()
        assert cancelled["status"] in ("cancelled", "failed")


def test_zrt_run_with_server_prints_what_zrt_run_prints(server):
    import subprocess
    import sys

    def run(*extra: str) -> dict:
        out = subprocess.run([sys.executable, "-m", "zrt_core.cli.main", "run", "llama3-8b",
                              "--hw", "nvidia_h100_sxm", "--batch", "4", "--input-len",
                              "512", "--output-len", "32", "--json", *extra],
                             capture_output=True, text=True, timeout=300, check=True)
        data = json.loads(out.stdout)
        assert data.pop("timings_s").keys()
        return data

    assert run("--server", server.url) == run()
    refused = subprocess.run([sys.executable, "-m", "zrt_core.cli.main", "run", "llama3-8b",
                              "--hw", "nvidia_h100_sxm", "--train", "--lora-rank", "8",
                              "--server", server.url], capture_output=True, text=True)
    assert refused.returncode == 2
    assert refused.stderr.startswith("zrt: error: --lora-rank is not available with --server")
