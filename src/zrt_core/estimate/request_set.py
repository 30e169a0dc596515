"""A finite set of fixed-length requests served by TensorRT-LLM's in-flight batching,
iteration by iteration: ramp-up, waves and drain (docs/inference-model.md, "Finite
request sets").

``trtllm-bench throughput`` queues every request of its dataset at once and reports the
output tokens over the time from the first request to the last completion. When the
engine holds a large share of the set at once (8 H200 hold 1,722 of Maverick's
128/4096 sequences; perf-overview runs 1,500 requests), most of that time is the ramp-up
(prompts admitted as the token budget allows) and the drain (the last wave decoding with
its slots emptying), which the steady state of :mod:`zrt_core.estimate.inference` leaves
out. :func:`simulate_requests` replays the scheduler on cohorts of identical requests;
:class:`IterationCost` prices each iteration from the estimator's priced steps.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

from attrs import field, frozen

from zrt_core.errors import InternalError, SpecError
from zrt_core.estimate.engine import cuda_graph_batch

#: The most iterations :func:`simulate_requests` replays (about a second of Python); a set
#: that long is many waves deep, where the steady state is within a fraction of a percent.
MAX_ITERATIONS = 2_000_000


@frozen
class IterationCost:
    """One iteration's time from the priced steps of a layout (one pipeline stage).

    The body (GEMMs, norms, collectives: everything but attention and the head) is
    linear in the tokens of the iteration between the two priced token counts, the decode
    step at ``ref_tokens`` sequences and the mixed step at ``ref_tokens`` + its prompt
    tokens (a GEMM's time is piecewise linear in its rows); below ``ref_tokens`` it is
    never less than its share ``tokens / ref_tokens`` of the decode step's body. The head
    (LM head, logits) is linear in its rows likewise. Decode attention reads the cache:
    it scales with the cached tokens of the decoding sequences; each prompt adds one
    prompt's prefill attention.

    :param body_s: the body of the decode step at ``ref_tokens`` sequences.
    :param body_per_token_s: the body's time per further token (the mixed step's slope).
    :param head_s: the head at ``ref_tokens`` rows; ``head_per_row_s`` its slope.
    :param attention_s: decode attention with ``ref_cached_tokens`` cached tokens in all.
    :param prompt_attention_s: one prompt's prefill attention.
    :param host_request_s: the executor's host time per scheduled request: an iteration
        takes at least this × its requests (docs/inference-model.md, "The host's share").
    :param graph_sizes: the CUDA-graph batch sizes a decode-only iteration is padded up to
        (:func:`~zrt_core.estimate.engine.cuda_graph_batch`): its body and head run on
        the padded rows, its attention on the real sequences' cache.
    """

    ref_tokens: int
    body_s: float
    body_per_token_s: float
    head_s: float
    head_per_row_s: float
    attention_s: float
    ref_cached_tokens: float
    prompt_attention_s: float
    host_request_s: float = 0.0
    graph_sizes: tuple[int, ...] = field(default=(), converter=tuple)

    @classmethod
    def from_steps(cls, gen: Mapping[str, float], mixed: Mapping[str, float], *,
                   ref_tokens: int, prompt_tokens: int, mean_context: int,
                   prompt_attention_s: float, host_request_s: float = 0.0,
                   graph_sizes: tuple[int, ...] = ()) -> IterationCost:
        """From the ``body`` / ``head`` / ``attention`` split of the decode step at
        ``ref_tokens`` sequences (``gen``) and of the same step with ``prompt_tokens``
        more tokens (``mixed``), every sequence at ``mean_context`` cached tokens."""
        span = max(prompt_tokens, 1)
        return cls(ref_tokens=ref_tokens, body_s=gen["body"],
                   body_per_token_s=(mixed["body"] - gen["body"]) / span,
                   head_s=gen["head"], head_per_row_s=(mixed["head"] - gen["head"]) / span,
                   attention_s=gen["attention"],
                   ref_cached_tokens=float(ref_tokens * mean_context),
                   prompt_attention_s=prompt_attention_s, host_request_s=host_request_s,
                   graph_sizes=graph_sizes)

    def body(self, tokens: float) -> float:
        line = self.body_s + (tokens - self.ref_tokens) * self.body_per_token_s
        if tokens < self.ref_tokens:
            return max(line, self.body_s * tokens / self.ref_tokens)
        return max(line, 0.0)

    def head(self, rows: float) -> float:
        line = self.head_s + (rows - self.ref_tokens) * self.head_per_row_s
        if rows < self.ref_tokens:
            return max(line, self.head_s * rows / self.ref_tokens)
        return max(line, 0.0)

    def time_s(self, gen: int, prompts: int, isl: int, cached_tokens: float) -> float:
        """An iteration decoding ``gen`` sequences (``cached_tokens`` cached among them)
        and prefilling ``prompts`` whole prompts of ``isl`` tokens."""
        if gen == 0 and prompts == 0:
            return 0.0
        attention = (self.attention_s * cached_tokens / self.ref_cached_tokens
                     if self.ref_cached_tokens > 0 else 0.0)
        rows = cuda_graph_batch(gen, self.graph_sizes) if prompts == 0 else gen
        device = (self.body(rows + prompts * isl) + self.head(rows + prompts) + attention
                  + prompts * self.prompt_attention_s)
        return max(device, self.host_request_s * (gen + prompts))


@frozen
class RequestSetRun:
    """What :func:`simulate_requests` found: the benchmark's wall time, its iterations
    (those that carried prompts among them), the most sequences ever running at once, and
    the output tokens per second over the whole set."""

    requests: int
    total_s: float
    iterations: int
    mixed_iterations: int
    peak_running: int
    output_tokens_per_s: float

    def to_json(self, steady_output_tokens_per_s: float) -> dict[str, Any]:
        """The throughput model's fields (``steady_…``: the steady state it replaces)."""
        return {"model": "finite request set, replayed iteration by iteration "
                         "(docs/inference-model.md)",
                "requests_per_replica": self.requests, "benchmark_s": self.total_s,
                "iterations": self.iterations, "prompt_iterations": self.mixed_iterations,
                "peak_running": self.peak_running,
                "steady_state_output_tokens_per_s": steady_output_tokens_per_s}


def simulate_requests(*, requests: int, input_len: int, output_len: int, max_batch: int,
                      max_num_tokens: int, kv_sequences: int, cost: IterationCost
                      ) -> RequestSetRun:
    """Replay TensorRT-LLM's scheduler (GUARANTEED_NO_EVICT, chunked context off) on
    ``requests`` identical requests queued at once.

    Each iteration decodes one token for every running sequence past its prompt, then
    admits waiting prompts first come first served while the iteration holds at most
    ``max_batch`` requests, ``max_num_tokens`` tokens (one per decode, the whole prompt
    per admission) and the KV cache at most ``kv_sequences`` sequences (each reserves its
    whole input + output). A prompt's iteration emits its first token, so a request
    admitted at iteration i decodes at i + 1 … i + output_len − 1 and frees its slot at
    i + output_len. Requests admitted together form one cohort.
    """
    if requests < 1:
        raise InternalError(f"a request set of {requests} requests")
    if min(max_batch, kv_sequences) < 1 or max_num_tokens < input_len:
        # trtllm-bench floors max_num_tokens at input + max batch without chunked context
        raise InternalError(f"no request can be admitted: max_batch {max_batch}, "
                            f"{kv_sequences} sequences fit, max_num_tokens {max_num_tokens} "
                            f"for {input_len}-token prompts")
    slots = min(max_batch, kv_sequences)
    if requests * output_len / slots > MAX_ITERATIONS:
        raise SpecError(
            f"{requests:,} requests of {output_len:,} output tokens at most {slots:,} at a "
            f"time take over {MAX_ITERATIONS:,} iterations to replay",
            "give fewer requests, or leave num_requests out for the steady state")
    waiting = requests
    cohorts: deque[tuple[int, int]] = deque()  # (admitted at iteration, sequences)
    running = 0  # sequences admitted and not finished
    admitted_at = 0  # Σ sequences × their admission iteration, over the running cohorts
    total_s = 0.0
    iteration = mixed = peak = 0
    while waiting or cohorts:
        # cohorts whose last token came out last iteration leave
        while cohorts and cohorts[0][0] + output_len <= iteration:
            i, n = cohorts.popleft()
            running -= n
            admitted_at -= n * i
        if not (waiting or cohorts):
            break
        gen = running  # every running sequence is past its prompt here
        # a sequence admitted at iteration i holds input + (iteration − i) tokens
        cached = float((input_len + iteration) * gen - admitted_at)
        admit = 0
        if waiting:
            admit = min(waiting, max_batch - gen, kv_sequences - running,
                        (max_num_tokens - gen) // input_len)
            admit = max(admit, 0)
        if admit == 0 and gen == 0:
            raise InternalError("the request-set simulation admitted nothing with nothing "
                                "running")
        total_s += cost.time_s(gen, admit, input_len, cached)
        if admit:
            waiting -= admit
            running += admit
            admitted_at += admit * iteration
            cohorts.append((iteration, admit))
            mixed += 1
        peak = max(peak, running)
        iteration += 1
    rate = requests * output_len / total_s if total_s > 0 else 0.0
    return RequestSetRun(requests=requests, total_s=total_s, iterations=iteration,
                         mixed_iterations=mixed, peak_running=peak, output_tokens_per_s=rate)
