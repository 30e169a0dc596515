"""Kill ``zrt serve`` (SIGKILL) while a job runs, start it again on the same database:
every job reaches a final state, the one that was running ran again, and every result
finished before the kill reads back identical."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

FINAL = ("done", "failed", "cancelled")


def _bodies() -> list[dict]:
    """Three validate jobs of four published serving records each, on the analytic
    front-end (seconds each: long enough to be caught running), and one estimate."""
    import yaml

    from zrt_core.validate import suite_path

    records = [r for r in yaml.safe_load(suite_path("public").read_text())
               if r.get("workload") == "infer"]
    jobs = [("/v1/validate", {"records": records[4 * i:4 * i + 4], "frontend": "analytic"})
            for i in range(3)]
    jobs.append(("/v1/estimate", {"model": "llama3-8b", "hardware": "nvidia_h100_sxm",
                                  "infer": {"input_len": 1024, "output_len": 128}}))
    return jobs


def test_a_killed_server_loses_no_job(server_factory, tmp_path, final):
    db = tmp_path / "restart.sqlite"
    server = server_factory("--workers", "1", db=db)
    with httpx.Client(base_url=server.url, timeout=60) as c:
        ids = [c.post(path, json=body).json()["id"] for path, body in _bodies()]
        deadline = time.perf_counter() + 180
        while time.perf_counter() < deadline:
            jobs = {j["id"]: j for j in c.get("/v1/jobs").json()["jobs"]}
            states = {j["status"] for j in jobs.values()}
            if "done" in states and "running" in states:
                done_before = {i: c.get(f"/v1/jobs/{i}").json() for i, j in jobs.items()
                               if j["status"] == "done"}
                break
            time.sleep(0.01)
        else:
            pytest.fail(f"never one job done and one running: {states}")
        server.kill()  # mid-job; its worker goes with it
    running = [i for i in ids if jobs[i]["status"] == "running"]
    restarted = server_factory("--workers", "1", db=db)
    with httpx.Client(base_url=restarted.url, timeout=60) as c:
        assert done_before and running
        after = {i: final(c, i, timeout_s=240) for i in ids}
        assert all(j["status"] == "done" for j in after.values()), after
        for i, job in done_before.items():
            assert after[i]["result"] == job["result"]
            assert after[i]["finished_s"] == job["finished_s"]  # not run again
        for i in running:
            assert after[i]["attempts"] == 2  # interrupted once, then run to the end
        csv = c.get(f"/v1/jobs/{ids[0]}/results.csv")
        assert csv.status_code == 200 and csv.text.startswith("id,status")


def test_a_stopped_server_leaves_no_worker_directory(server_factory, tmp_path, final):
    # the workers' empty HuggingFace home is the pool's, made under TMPDIR when the pool
    # starts and removed when the server stops (SIGTERM), though its workers are killed,
    # not asked; before, each worker made its own and left it behind
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    server = server_factory("--workers", "2", env={"TMPDIR": str(tmp)})
    client = httpx.Client(base_url=server.url, timeout=30)
    job = client.post("/v1/estimate", json={
        "model": "llama3-8b", "hardware": "nvidia_h100_sxm",
        "infer": {"input_len": 1024, "output_len": 128}}).json()
    assert final(client, job["id"])["status"] == "done"
    assert len(list(tmp.glob("zrt-serve-hf-*"))) == 1  # one for the pool's two workers
    server.stop()
    assert server.proc.returncode is not None
    assert not list(tmp.glob("zrt-serve-hf-*"))
