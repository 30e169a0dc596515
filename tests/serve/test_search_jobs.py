"""The search and compare jobs of ``zrt serve``: a request checked before it is queued (one
line for a bad space, hardware or model path) and a worker's result equal to the library's
``search(...).to_json()`` for the same space."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pydantic")

from zrt_core.errors import ZrtError
from zrt_core.plugins import get_plugin_manager
from zrt_core.serve.kinds import KINDS, PrepareContext
from zrt_core.serve.search_kinds import (
    CompareRequest,
    SearchRequest,
    prepare_search,
    run_search,
)

TINY = {"model_type": "gpt2", "n_embd": 64, "n_layer": 4, "n_head": 4, "n_inner": 256,
        "vocab_size": 128, "n_positions": 256}
#: (tp, pp) ∈ {1, 2}² on 4 GPUs, recompute none: 4 layouts (as tests/search's TRAIN)
BODY = {"model": TINY, "hardware": "h100", "mode": "train", "gpus": [4], "global_batch": 8,
        "seq_len": 64, "tp": [1, 2], "pp": [1, 2], "cp": [1], "vp": [1], "micro_batch": [1],
        "recompute": ["none"], "sharding": ["zero1"], "pp_schedule": ["1f1b"], "top_k": 2}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ZRT_CACHE_DIR", str(tmp_path / "zrt-cache"))


def _ctx(tmp_path):
    return PrepareContext(host=get_plugin_manager(), model_dir=tmp_path)


def test_search_and_compare_are_job_kinds():
    assert KINDS["search"].request_model is SearchRequest
    assert KINDS["compare"].request_model is CompareRequest


@pytest.mark.needs("zrt-nvidia")
def test_a_search_job_answers_what_the_library_answers(tmp_path):
    from zrt_core.search.run import search
    from zrt_core.search.space import TrainSpace

    body = SearchRequest(**BODY).model_dump()
    payload = prepare_search(body, _ctx(tmp_path))
    done: list[tuple[int, int]] = []
    result, files = run_search(payload, lambda i, n: done.append((i, n)))
    want = search(TINY, "h100", TrainSpace(gpus=(4,), global_batch=8, seq_len=64, tp=(1, 2),
                                           pp=(1, 2), cp=(1,), vp=(1,), micro_batch=(1,),
                                           recompute=("none",), sharding=("zero1",),
                                           pp_schedule=("1f1b",)), top_k=2).to_json()
    # 4 layouts enumerated and evaluated; the same ranking and rows (timings aside)
    assert result["enumerated"] == want["enumerated"] == 4
    assert result["results"] == want["results"] and files == {}
    assert done and done[-1] == (4, 4)
    json.dumps(result)  # what the job stores is JSON


@pytest.mark.needs("zrt-nvidia")
@pytest.mark.parametrize("change, words", [
    ({"global_batch": None}, "global_batch"),
    ({"hardware": "no_such_gpu"}, "no_such_gpu"),
    ({"model": "../outside"}, "outside"),
    # what belongs to a serving search is refused in a training one, as zrt search does
    ({"ttft_ms": 5.0}, "serving targets"),
    ({"dp": [2]}, "what is left of the GPUs"),
])
def test_a_bad_request_is_refused_before_it_is_queued(tmp_path, change, words):
    body = SearchRequest(**{**BODY, **change}).model_dump()
    with pytest.raises(ZrtError, match=words):
        prepare_search(body, _ctx(tmp_path))
