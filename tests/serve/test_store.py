"""The job store alone (standard library sqlite3, no server): a restart queues a running job
again, fails it once interrupted ``max_attempts`` times, and keeps finished results."""

from __future__ import annotations

import pytest

from zrt_core.serve.store import JobStore, KeyConflict, QueueFull


def test_a_running_job_is_requeued_then_failed_after_the_limit(tmp_path):
    db = tmp_path / "jobs.sqlite"
    store = JobStore(db, max_attempts=2)
    job, created = store.submit("estimate", {"x": 1}, "h1")
    assert created and job.status == "queued"
    assert store.claim().id == job.id  # attempt 1, then the server dies
    store.close()
    store = JobStore(db, max_attempts=2)
    assert store.recover() == (1, 0)
    assert store.get(job.id).status == "queued"
    assert store.claim().attempts == 2  # attempt 2 dies too: the limit
    store.close()
    store = JobStore(db, max_attempts=2)
    assert store.recover() == (0, 1)
    failed = store.get(job.id)
    assert failed.status == "failed" and "2 times" in failed.error


def test_finished_results_survive_and_answer_the_same_request(tmp_path):
    db = tmp_path / "jobs.sqlite"
    store = JobStore(db)
    job, _ = store.submit("estimate", {"x": 1}, "h1")
    store.claim()
    store.finish(job.id, "done", result={"step_time_s": 1.5}, files={"trace.json": b"{}"})
    store.close()
    store = JobStore(db)
    store.recover()
    again, created = store.submit("estimate", {"x": 1}, "h1")
    assert not created and again.id == job.id and again.result == {"step_time_s": 1.5}
    assert store.file(job.id, "trace.json") == b"{}" and again.files == ("trace.json",)


def test_queue_limit_idempotency_key_and_cancel(tmp_path):
    store = JobStore(tmp_path / "jobs.sqlite")
    first, _ = store.submit("estimate", {"x": 1}, "h1", idempotency_key="k", max_queued=1)
    with pytest.raises(QueueFull):
        store.submit("estimate", {"x": 2}, "h2", max_queued=1)
    same, created = store.submit("estimate", {"x": 1}, "h1", idempotency_key="k",
                                 max_queued=1)
    assert same.id == first.id and not created
    with pytest.raises(KeyConflict):
        store.submit("estimate", {"x": 2}, "h2", idempotency_key="k")
    assert store.cancel(first.id).status == "cancelled"
    store.finish(first.id, "done", result={})  # a final state stays final
    assert store.get(first.id).status == "cancelled"
