"""The finite request set (``estimate/request_set.py``): TensorRT-LLM's scheduler replayed on
identical requests and the iteration price from two priced steps (``num_requests`` through
``estimate_inference``: test_inference.py)."""

from __future__ import annotations

import pytest

from zrt_core.errors import InternalError, SpecError
from zrt_core.estimate.request_set import IterationCost, simulate_requests

#: one second an iteration, whatever it holds: the total time is the iteration count
FLAT = IterationCost(ref_tokens=1, body_s=1.0, body_per_token_s=0.0, head_s=0.0,
                     head_per_row_s=0.0, attention_s=0.0, ref_cached_tokens=1.0,
                     prompt_attention_s=0.0)


def test_iteration_cost_is_linear_between_the_priced_steps():
    # decode step at 100 sequences: body 10 ms, head 1 ms, attention 4 ms over 100 x 50
    # cached tokens; the mixed step's slopes 0.05 ms a token (body), 0.001 ms a row (head)
    cost = IterationCost(ref_tokens=100, body_s=10e-3, body_per_token_s=0.05e-3,
                         head_s=1e-3, head_per_row_s=0.001e-3, attention_s=4e-3,
                         ref_cached_tokens=5000.0, prompt_attention_s=0.5e-3)
    # 100 decodes + 2 prompts of 20: body(140) = 10 + 40 x 0.05 = 12; head(102) =
    # 1 + 2 x 0.001 = 1.002; attention 4 x 5000/5000 = 4; prompts 2 x 0.5 = 1 -> 18.002 ms
    assert cost.time_s(100, 2, 20, 5000.0) == pytest.approx(18.002e-3, rel=1e-12)
    # 20 decodes, 1000 cached: body(20) = 10 - 80 x 0.05 = 6 (above 10 x 20/100 = 2);
    # head(20) = 1 - 80 x 0.001 = 0.92; attention 4 x 1000/5000 = 0.8 -> 7.72 ms
    assert cost.time_s(20, 0, 20, 1000.0) == pytest.approx(7.72e-3, rel=1e-12)
    assert cost.time_s(0, 0, 20, 0.0) == 0.0


def test_a_decode_only_iteration_runs_its_padded_cuda_graph():
    # the steps of the test above, with CUDA graphs of 64 and 128 sequences
    cost = IterationCost(ref_tokens=100, body_s=10e-3, body_per_token_s=0.05e-3,
                         head_s=1e-3, head_per_row_s=0.001e-3, attention_s=4e-3,
                         ref_cached_tokens=5000.0, prompt_attention_s=0.5e-3,
                         graph_sizes=(64, 128))
    # 100 decodes alone run the 128 graph: body(128) = 10 + 28 x 0.05 = 11.4; head(128) =
    # 1 + 28 x 0.001 = 1.028; attention on the real sequences' 5000 cached tokens 4
    # -> 16.428 ms
    assert cost.time_s(100, 0, 20, 5000.0) == pytest.approx(16.428e-3, rel=1e-12)
    # with prompts the iteration runs eagerly, unpadded: 18.002 ms as above
    assert cost.time_s(100, 2, 20, 5000.0) == pytest.approx(18.002e-3, rel=1e-12)
    # 129 decodes fit no graph: eager, body 10 + 29 x 0.05 = 11.45, head 1.029 -> 16.479
    assert cost.time_s(129, 0, 20, 5000.0) == pytest.approx(16.479e-3, rel=1e-12)


def test_iteration_cost_never_falls_below_its_share_of_the_decode_step():
    # a steep slope (0.2 ms a token) would give body(20) = 10 - 80 x 0.2 = -6 ms; the
    # floor is the step's share 10 x 20/100 = 2 ms
    cost = IterationCost(ref_tokens=100, body_s=10e-3, body_per_token_s=0.2e-3,
                         head_s=0.0, head_per_row_s=0.0, attention_s=0.0,
                         ref_cached_tokens=1.0, prompt_attention_s=0.0)
    assert cost.body(20) == pytest.approx(2e-3, rel=1e-12)


def test_iteration_cost_from_two_steps():
    gen = {"body": 10e-3, "head": 1e-3, "attention": 4e-3}
    mixed = {"body": 14e-3, "head": 1.5e-3, "attention": 9e-3}
    cost = IterationCost.from_steps(gen, mixed, ref_tokens=100, prompt_tokens=80,
                                    mean_context=50, prompt_attention_s=0.5e-3)
    # slopes over the 80 prompt tokens: (14 - 10)/80 = 0.05 ms, (1.5 - 1)/80 = 0.00625 ms;
    # the mixed step's attention is not used (its prompts are prefill attention)
    assert cost.body_per_token_s == pytest.approx(0.05e-3, rel=1e-12)
    assert cost.head_per_row_s == pytest.approx(0.00625e-3, rel=1e-12)
    assert (cost.attention_s, cost.ref_cached_tokens) == (4e-3, 5000.0)


def test_batch_limited_waves():
    # 3 requests of 2 + 2 tokens, 2 at a time, 4 tokens an iteration:
    # it 0: admit 2 (4 // 2 = 2 prompts); it 1: 2 decode (their 2nd and last token);
    # it 2: both gone, admit the 3rd; it 3: it decodes; done -> 4 iterations, 2 with
    # prompts, 3 x 2 tokens / 4 s = 1.5 tok/s
    run = simulate_requests(requests=3, input_len=2, output_len=2, max_batch=2,
                            max_num_tokens=4, kv_sequences=2, cost=FLAT)
    assert (run.iterations, run.mixed_iterations, run.peak_running) == (4, 2, 2)
    assert run.total_s == 4.0
    assert run.output_tokens_per_s == 1.5


def test_token_budget_limited_ramp():
    # 4 requests of 3 + 3 tokens, 7 tokens an iteration, room for 8:
    # it 0: admit 7 // 3 = 2; it 1: 2 decode, (7 - 2) // 3 = 1 more; it 2: 3 decode,
    # (7 - 3) // 3 = 1 more (4 running); it 3: the first 2 done, 2 decode; it 4: 1 decodes;
    # done -> 5 iterations, 3 with prompts, 4 x 3 / 5 = 2.4 tok/s
    run = simulate_requests(requests=4, input_len=3, output_len=3, max_batch=8,
                            max_num_tokens=7, kv_sequences=8, cost=FLAT)
    assert (run.iterations, run.mixed_iterations, run.peak_running) == (5, 3, 4)
    assert run.output_tokens_per_s == pytest.approx(2.4, rel=1e-12)


def test_cached_tokens_grow_one_a_step():
    # attention only, 1 s per cached token (ref 1 token = 1 s): 1 request of 5 + 3 tokens
    # decodes at iterations 1 and 2 with 5 + 1 = 6 and 5 + 2 = 7 tokens cached -> 13 s
    cost = IterationCost(ref_tokens=1, body_s=0.0, body_per_token_s=0.0, head_s=0.0,
                         head_per_row_s=0.0, attention_s=1.0, ref_cached_tokens=1.0,
                         prompt_attention_s=0.0)
    run = simulate_requests(requests=1, input_len=5, output_len=3, max_batch=1,
                            max_num_tokens=8, kv_sequences=1, cost=cost)
    assert (run.iterations, run.total_s) == (3, 13.0)


def test_a_set_that_cannot_start_or_runs_too_long_is_refused():
    with pytest.raises(InternalError, match="no request can be admitted"):
        simulate_requests(requests=1, input_len=10, output_len=1, max_batch=1,
                          max_num_tokens=9, kv_sequences=1, cost=FLAT)
    # 10^6 requests x 10^3 tokens one at a time: 10^9 iterations > 2,000,000
    with pytest.raises(SpecError, match="iterations to replay"):
        simulate_requests(requests=1_000_000, input_len=1, output_len=1000, max_batch=1,
                          max_num_tokens=8, kv_sequences=1, cost=FLAT)


def test_an_iteration_takes_at_least_the_executors_host_work():
    # 0.1 ms of host work a scheduled request: 100 decodes + 2 prompts take max(18.002 ms on
    # the GPU, 102 x 0.1 = 10.2 ms) = 18.002 ms; 300 decodes (cached 5000) max(body 10 +
    # 200 x 0.05 = 20, head 1 + 200 x 0.001 = 1.2, attention 4: 25.2 ms; 30 ms) = 30 ms
    cost = IterationCost(ref_tokens=100, body_s=10e-3, body_per_token_s=0.05e-3,
                         head_s=1e-3, head_per_row_s=0.001e-3, attention_s=4e-3,
                         ref_cached_tokens=5000.0, prompt_attention_s=0.5e-3,
                         host_request_s=0.1e-3)
    assert cost.time_s(100, 2, 20, 5000.0) == pytest.approx(18.002e-3, rel=1e-12)
    assert cost.time_s(300, 0, 20, 5000.0) == pytest.approx(30e-3, rel=1e-12)
