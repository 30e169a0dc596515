"""``estimate_inference``: TTFT, TPOT, throughput and memory of serving a model on a machine
and a parallel layout (the model is documented in docs/inference-model.md).

Pipeline per priced step: the captured phase (batch 1) → :class:`Rescale` (batch, cached
tokens) → :class:`ParallelTransform` (TP/SP/CP/EP per-rank shapes and collectives) →
:class:`Quantize` → plugins' ``before_fusion`` transforms → :class:`Fusion` (the
platform's kernels) → plugins' ``after_fusion`` transforms → :class:`PagedKVCache` →
``price_graph`` → the serving scheduler (every collective on the critical path). The
captures are reused for every layout, batch and output length; only their prompt length
needs its own capture.

Three modes:

``latency`` (a batch is given): the batch's prompts are prefilled together (TTFT), then
    decode steps run at the mean context ``input_len + output_len / 2`` (TPOT);
    throughput = batch × output_len / (TTFT + (output_len − 1) × TPOT).
``max_throughput`` (batch None): offline in-flight batching as ``trtllm-bench`` runs it.
    Concurrency C = min(sequences whose KV cache fits, the engine's max batch, the token
    budget's steady state); every iteration decodes one token for each running sequence and
    fills the rest of the engine's token budget with new prompts. Over ``output_len``
    iterations a slot prefills one prompt and emits ``output_len`` tokens, so
    throughput = C × output_len / (n_mixed × t_mixed + (output_len − n_mixed) × t_decode).
``concurrency`` (``InferSpec.concurrency`` = N): closed-loop clients keeping N requests in
    flight on the same in-flight batching: the steady state above with C also at most
    ⌈N / dp⌉ per replica (a client's next request replaces the one that completed, so the
    engine runs N sequences when they fit, not a static batch: TTFT is the mixed
    iterations one prompt needs, not a batch's prefill).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from attrs import evolve

from zrt_core.capture.sources import raw_config
from zrt_core.checks import check_hardware_arg, check_infer_request
from zrt_core.cost.pricing import (
    OUTSIDE_LAYERS,
    CostedGraph,
    build_backends,
    node_price_key,
    price_graph,
)
from zrt_core.errors import SpecError, ZrtError
from zrt_core.estimate.captures import CapturedModel, load_or_capture
from zrt_core.estimate.engine import (
    GIB,
    EngineProfile,
    EngineSettings,
    bench_group_size,
    cuda_graph_batch,
    engine_profile,
)
from zrt_core.estimate.guards import check_flops, check_serving
from zrt_core.estimate.iterations import (
    admission_limited,
    attention_dp_iteration,
    prompt_chunk,
    roles,
    routed_expert_s,
)
from zrt_core.estimate.memory import (
    KVCacheSize,
    activation_peak_bytes,
    cache_states,
    kv_cache_size,
    weights_bytes,
)
from zrt_core.estimate.request_set import IterationCost, RequestSetRun, simulate_requests
from zrt_core.estimate.serving import PagedKVCache, Rescale
from zrt_core.hardware import HardwareSpec
from zrt_core.ir.graph import Category, OpGraph, Phase, dtype_bytes
from zrt_core.reports.inference import InferenceReport, MemoryReport, PhaseBreakdown
from zrt_core.strategy import InferSpec, Parallel, check_layout, serving_expert_tp
from zrt_core.transforms.base import TransformContext, around_fusion
from zrt_core.transforms.parallel import (
    DataParallelReplicas,
    ParallelTransform,
    PipelinePlan,
    replace_graph,
    stage_graph,
)
from zrt_core.transforms.quant import Quantize, kv_dtype_name

if TYPE_CHECKING:
    from zrt_core.plugins import PluginHost
    from zrt_core.schedule.timeline import Timeline


def estimate_inference(model: Any, hardware: HardwareSpec | str, parallel: Parallel,
                       infer: InferSpec, *, host: PluginHost | None = None,
                       captured: Any = None, engine: str | EngineProfile = "trtllm",
                       use_cache: bool | None = None) -> InferenceReport:
    """Predict serving ``model`` on ``hardware`` with ``parallel`` for ``infer``.

    :param model: a bundled name, a config path or mapping (ignored when ``captured``).
    :param captured: a :class:`CapturedModel` or a ``CaptureResult`` with prefill and decode
        captured at batch 1 and ``infer.input_len`` — reuse it across layouts.
    :param engine: ``trtllm`` (trtllm-bench's batching rules) or ``vllm``.
    :raises LayoutError: the layout does not divide the model (a one-line message naming
        the dimension).
    """
    start = time.perf_counter()
    if host is None:
        from zrt_core.plugins import get_plugin_manager

        host = get_plugin_manager()
    check_hardware_arg(hardware)
    if captured is not None and not isinstance(captured, CapturedModel):
        captured = CapturedModel.from_capture(captured)
    config, where = raw_config(model, host, captured=captured)
    dims = check_infer_request(config, parallel, infer, positions=captured is None,
                               where=where)
    parallel = serving_expert_tp(parallel, moe=dims.is_moe)
    hw = hardware if isinstance(hardware, HardwareSpec) else host.hardware_spec(hardware)
    if captured is None:
        captured = load_or_capture(model, infer.input_len, host=host, dtype=infer.dtype,
                                   use_cache=use_cache)
    if captured.seq_len != infer.input_len:
        raise SpecError(
            f"the capture has prompts of {captured.seq_len} tokens, the workload "
            f"{infer.input_len}", "capture at the workload's input length")
    captured_s = time.perf_counter() - start
    check_flops(captured.config, captured.graphs, host, model=captured.name)
    dims = captured.dims
    layout = check_layout(parallel, dims)
    report = _Estimator(captured, hw, layout, infer, host, engine).run()
    timings = {**report.timings_s, "capture_s": captured_s,
               "total_s": time.perf_counter() - start}
    report = evolve(report, timings_s=timings)
    check_serving(report)
    return report


# -- one step's graph and price -----------------------------------------------------------


class _Estimator:
    def __init__(self, captured: CapturedModel, hw: HardwareSpec, parallel: Parallel,
                 infer: InferSpec, host: PluginHost, engine: str) -> None:
        self.cap = captured
        self.hw = hw
        self.p = parallel
        self.infer = infer
        self.host = host
        self.engine = engine_profile(engine)
        hw = self.engine.hardware(hw)
        self.hw = hw
        self.dims = captured.dims
        self.ctx = TransformContext(dims=self.dims, hardware=hw, parallel=parallel, host=host,
                                    infer=infer)
        self.kv_dtype = kv_dtype_name(infer.kv_dtype) if infer.kv_dtype else None
        self.transforms = self._transforms()
        self.backends = _CachedBackends(hw, build_backends(hw, host))
        self.plan = PipelinePlan.build(self.dims.layers, parallel.pp, parallel.vp)
        self._graphs: dict[tuple[str, int, int, bool], OpGraph] = {}
        self._raw: dict[str, OpGraph] = {}
        self._priced: dict[tuple[str, int, int], list[CostedGraph]] = {}
        self.notes: list[str] = []
        self.caches = cache_states(captured.graph(Phase.DECODE), captured.graph(Phase.PREFILL))
        #: host time per scheduled request of one executor iteration (0: not modelled)
        self.host_request_s = (hw.efficiency.serving_host_request_us * 1e-6
                               if self.engine.host_floor else 0.0)
        self._host_bound: list[tuple[str, float, float, float]] = []

    def _transforms(self) -> list[Any]:
        out: list[Any] = []
        if self.infer.quant != "none" or self.kv_dtype is not None:
            out.append(Quantize(self.infer.quant, kv_dtype=self.kv_dtype))
        out.extend(around_fusion(self.ctx, _fusion_transform()))
        out.extend([PagedKVCache(), DataParallelReplicas()])
        return out

    def graph(self, phase: str, batch: int, cache_len: int = 0, *, kernels: bool = True
              ) -> OpGraph:
        """The transformed graph of one step (pipeline stages are cut by :meth:`priced`).

        :param kernels: run fusion and the paged-cache rewrite too (what pricing needs;
            memory accounting needs only the per-rank shapes and dtypes).
        """
        key = (phase, batch, cache_len, kernels)
        g = self._graphs.get(key)
        if g is None:
            raw = self.raw_graph(phase)
            rescale = Rescale(batch, cache_len or None)
            # rescaling and sharding in one walk over the graph
            names = ["rescale", "parallel"]
            g = ParallelTransform(self.cap.tp_plan, extra_seeds=rescale.seeds,
                                  extra_attrs=rescale.attrs).apply(raw, self.ctx)
            g = rescale.updated_meta(raw, g)
            for t in self.transforms:
                if not kernels and t.name in ("fusion", "paged_kv_cache"):
                    continue
                g = t.apply(g, self.ctx)
                names.append(t.name)
            g = replace_graph(g, meta={**g.meta, "transforms": tuple(names)})
            self._graphs[key] = g
        return g

    def raw_graph(self, phase: str) -> OpGraph:
        """The captured graph of ``phase`` with the vocabulary the engine allocates
        (:mod:`zrt_core.transforms.vocab`: vLLM a multiple of 64, TensorRT-LLM of TP)."""
        g = self._raw.get(phase)
        if g is None:
            from zrt_core.transforms.vocab import pad_vocabulary, padded_vocab

            vocab = self.dims.vocab
            padded = padded_vocab(vocab, self.engine.name, self.p.tp)
            (g,), note = pad_vocabulary((self.cap.graph(phase),), vocab, padded,
                                        other_dims=(self.dims.hidden, self.infer.input_len))
            note = note and f"{note} ({self.engine.name})"
            if note and note not in self.notes:
                self.notes.append(note)
            self._raw[phase] = g
        return g

    def priced(self, phase: str, batch: int, cache_len: int = 0) -> list[CostedGraph]:
        """One costed graph per pipeline stage (one for pp = 1)."""
        key = (phase, batch, cache_len)
        out = self._priced.get(key)
        if out is None:
            g = self.graph(phase, batch, cache_len)
            stages = [g] if self.p.pp == 1 else [
                stage_graph(g, self.plan, s, self.p) for s in range(len(self.plan.stages))]
            out = [price_graph(s, self.hw, self.host, backends=[self.backends])
                   for s in stages]
            self._priced[key] = out
        return out

    # -- the model ---------------------------------------------------------------------

    def run(self) -> InferenceReport:
        t0 = time.perf_counter()
        infer = self.infer
        isl, osl = infer.input_len, infer.output_len
        mean_cache = isl + osl // 2
        memory = self._memory_model()
        timings: dict[str, float] = {"memory_s": time.perf_counter() - t0}
        if infer.batch is not None:
            report = self._latency(infer.batch, mean_cache, memory)
        else:
            report = self._max_throughput(mean_cache, memory)
        timings["model_s"] = time.perf_counter() - t0
        return evolve(report, timings_s=timings)

    def _memory_model(self) -> dict[str, Any]:
        """Weights, KV per token and activations per device (the largest pipeline stage)."""
        prefill = self.graph(Phase.PREFILL, 1)
        decode = self.graph(Phase.DECODE, 1, self.infer.input_len, kernels=False)
        stages = [set(s.layers) for s in self.plan.stages]
        weights = 0.0
        kv = KVCacheSize(0.0)
        tokens = self._sequence_tokens()
        per_rank_stages: dict[int, list[set[int]]] = {}
        for st, layers in zip(self.plan.stages, stages, strict=True):
            per_rank_stages.setdefault(st.rank, []).append(layers)
        for rank_layers in per_rank_stages.values():
            all_layers = set().union(*rank_layers)
            w = _stage_weights([prefill, decode], all_layers, self.plan, rank_layers)
            rank_kv = kv_cache_size(decode, all_layers, caches=self.caches)
            if w > weights:
                weights = w
            if rank_kv.for_sequence(tokens) > kv.for_sequence(tokens):
                kv = rank_kv
        act_per_token = activation_peak_bytes(prefill) / max(self.infer.input_len, 1)
        return {"weights": weights, "kv": kv, "act_per_token": act_per_token}

    def _sequence_tokens(self) -> int:
        """Tokens a sequence holds cache for: input + output, in whole KV blocks."""
        block = self.engine.kv_block_tokens
        return math.ceil((self.infer.input_len + self.infer.output_len) / block) * block

    def _kv_per_sequence(self, memory: Mapping[str, Any]) -> float:
        return memory["kv"].for_sequence(self._sequence_tokens())

    def _memory_report(self, memory: Mapping[str, Any], activation_tokens: int, batch: int
                       ) -> tuple[MemoryReport, int]:
        capacity = self.hw.memory.capacity_gb * GIB
        weights = memory["weights"]
        activations = memory["act_per_token"] * activation_tokens
        reserve = self.engine.runtime_reserve_gib * GIB
        budget = self.engine.kv_budget_bytes(capacity, weights, activations)
        per_seq = self._kv_per_sequence(memory)
        max_batch = int(budget // per_seq) if per_seq > 0 and budget > 0 else 0
        in_use = per_seq * batch
        fits = budget > 0 and batch <= max_batch
        message = ""
        if budget <= 0:
            message = (f"weights {weights / GIB:.1f} GiB + activations "
                       f"{activations / GIB:.1f} GiB + runtime {reserve / GIB:.1f} GiB exceed "
                       f"the {capacity / GIB:.1f} GiB of one device; add tensor/pipeline "
                       "stages or quantise")
        elif batch > max_batch:
            message = (f"{batch} sequences need {in_use / GIB:.1f} GiB of KV cache per "
                       f"device but {budget / GIB:.1f} GiB is left ({max_batch} fit)")
        report = MemoryReport(capacity=capacity, weights=weights, activations=activations,
                              reserve=reserve, kv_budget=max(budget, 0.0),
                              kv_per_token=memory["kv"].per_token, kv_per_sequence=per_seq,
                              kv_fixed_per_sequence=memory["kv"].per_sequence_fixed,
                              kv_by_layer_kind=memory["kv"].by_kind,
                              kv_in_use=min(in_use, max(budget, 0.0)) if fits else in_use,
                              fits=fits, message=message)
        return report, max_batch

    def _step_time(self, phase: str, batch: int, cache_len: int = 0) -> float:
        """One step's time: the stages one after another (a batch passes every stage)."""
        return sum(self._stage_list(phase, batch, cache_len))

    def _hidden(self, costed: CostedGraph) -> float:
        """Time the shared experts hide under the EP all-to-all of one stage when they run on
        their own stream (``InferSpec.shared_expert_overlap``): the serial sum of the
        stage's kernels minus its schedule with asynchronous EP collectives (0 without the
        flag, or without EP collectives to run under)."""
        if not self.infer.shared_expert_overlap or self.p.ep <= 1:
            return 0.0
        from zrt_core.estimate.shared_experts import hidden_shared_s

        return hidden_shared_s(costed)

    def _latency(self, batch: int, mean_cache: int, memory: Mapping[str, Any]
                 ) -> InferenceReport:
        isl, osl = self.infer.input_len, self.infer.output_len
        mem, max_batch = self._memory_report(memory, batch * isl, batch)
        ttft = self._host_floor("prefill", self._step_time(Phase.PREFILL, batch), batch)
        tpot = self._host_floor("decode", self._step_time(Phase.DECODE, batch, mean_cache),
                                batch)
        total = ttft + max(osl - 1, 0) * tpot
        per_replica = batch * osl / total if total > 0 else 0.0
        throughput = {"model": "static batch: prefill together, then decode steps",
                      "decode_step_ms": tpot * 1e3, "prefill_ms": ttft * 1e3,
                      "mean_context": mean_cache}
        note = f"does not fit: {mem.message}"
        if not mem.fits and note not in self.notes:
            self.notes.append(note)
        return self._report("latency", batch, ttft, tpot, per_replica, max_batch, mem,
                            (Phase.PREFILL, batch, 0), (Phase.DECODE, batch, mean_cache),
                            throughput)

    def _max_throughput(self, mean_cache: int, memory: Mapping[str, Any]
                        ) -> InferenceReport:
        isl, osl = self.infer.input_len, self.infer.output_len
        p, pp = self.p, self.p.pp
        kv_per_token_model, kv_extra_model, recurrent = self._kv_bytes_model()
        settings = self.engine.settings(
            total_params=self.cap.total_params,
            weight_bytes_per_param=_engine_bytes_per_param(self.infer),
            kv_bytes_per_token_model=kv_per_token_model,
            kv_extra_bytes_per_request_model=kv_extra_model, recurrent_state=recurrent,
            device_gib=self.hw.memory.capacity_gb,
            tp=bench_group_size(p.tp, p.ep, p.expert_tp), pp=pp,
            input_len=isl, output_len=osl, device=self.hw.id,
            online=self.infer.concurrency is not None)
        budget_tokens = settings.max_num_tokens
        mem, fit = self._memory_report(memory, budget_tokens, 0)
        if fit < 1:
            mem = evolve(mem, fits=False, message=mem.message or "no sequence fits")
            self.notes.append(f"does not fit: {mem.message}")
            report = self._latency(1, mean_cache, memory)
            return evolve(report, mode="max_throughput", output_tokens_per_s=0.0,
                          output_tokens_per_s_per_gpu=0.0, requests_per_s=0.0,
                          memory=mem, max_batch=0, batch=0)
        concurrency = min(fit, settings.max_batch * pp)
        clients = self.infer.concurrency
        each = math.ceil(clients / p.dp) if clients is not None else 0  # clients a replica
        if clients is not None and each < pp:
            # fewer requests than pipeline stages: no micro-batch for every stage, each
            # request passes the stages alone (a batch of them, prefill then decode)
            self.notes.append(f"concurrency {clients:,}: {each:,} requests a replica cannot "
                              f"fill its {pp} pipeline stages; priced as a batch of {each:,} "
                              "passing every stage")
            return evolve(self._latency(each, mean_cache, memory), mode="concurrency")
        if clients is not None:
            if each > concurrency:
                self.notes.append(
                    f"concurrency {clients:,}: {each:,} requests a replica, but the engine "
                    f"runs at most {concurrency:,} at once (KV cache {fit:,} sequences, max "
                    f"batch {settings.max_batch * pp:,}); the rest queue")
            concurrency = min(concurrency, each)
        micro = concurrency / pp  # sequences per in-flight micro-batch
        # steady state: each iteration decodes `micro` tokens and prefills micro·isl/osl
        token_limited = micro * (1 + isl / osl) > budget_tokens
        if token_limited:
            micro = budget_tokens / (1 + isl / osl)
            concurrency = micro * pp
        c = max(1, math.floor(micro))
        # the clients bind and the pipeline's micro-batches cannot all hold as many: N
        # sequences run in micro-batches of ⌈N/pp⌉ and ⌊N/pp⌋, the larger setting the pace
        clients_bind = (clients is not None and pp > 1 and not token_limited
                        and concurrency == each)
        if clients_bind:
            c = math.ceil(micro)
        # admission bound: a slot is refilled only as fast as the iterations' spare budget
        # admits prompts; if c prompts need more than osl iterations of it, fewer slots
        # are ever busy (every iteration is mixed and holds osl × admitted-per-iteration
        # sequences)
        admitted = admission_limited(c, budget_tokens, isl, osl, self.engine.chunked_prefill)
        prefill_limited = admitted < c
        c = admitted
        chunk = prompt_chunk(c, budget_tokens, isl, self.engine.chunked_prefill)
        n_mixed = min(osl, c * isl / chunk)
        prefill_budget = chunk
        # a decode-only iteration replays the CUDA graph of the next captured size, its
        # extra rows dummy requests with next to no cache (docs/inference-model.md,
        # "CUDA-graph padding"): that many rows over the same cached tokens
        graphs = self.engine.graph_sizes(settings)
        graph_c = cuda_graph_batch(c, graphs)
        t_gen = self._host_floor("decode", self._stage_max(
            Phase.DECODE, graph_c, max(1, mean_cache * c // graph_c)), c)
        if graph_c > c and n_mixed < osl:
            self.notes.append(
                f"decode-only iterations replay the CUDA graph for {graph_c:,} sequences, "
                f"{graph_c - c:,} of them padding ({self.engine.name}'s graph sizes with "
                "enable_padding)")
        mix_stages = self._mixed_iteration(c, chunk, mean_cache)
        t_mix = self._host_floor("mixed", max(mix_stages) if pp > 1 else sum(mix_stages),
                                 c + chunk / isl)
        period = pp * (n_mixed * t_mix + (osl - n_mixed) * t_gen)
        adp = self._attention_dp_iterations(c, chunk, mean_cache, n_mixed, t_gen, t_mix)
        if adp is not None:
            period = osl * adp["iteration_s"]
        running = c * pp  # sequences in flight a replica
        if clients_bind and not prefill_limited:
            running = min(running, each)
        per_replica = running * osl / period if period > 0 else 0.0
        tpot = period / osl
        # a prompt is done after its chunks' iterations; the first token then has passed
        # every pipeline stage once
        ttft = t_mix * max(0, math.ceil(isl / prefill_budget) - 1) + (
            sum(mix_stages) if pp > 1 else t_mix)
        if pp == 1 and n_mixed >= osl and prefill_budget >= isl:
            # every steady-state iteration carries prompt chunks and a whole prompt fits in
            # one: the first token and every later one each wait one mixed iteration
            self.notes.append(
                f"TTFT equals TPOT: in the steady state every iteration mixes prompt chunks "
                f"({chunk:,} tokens) with the {c:,} decodes, and a whole {isl:,}-token prompt "
                f"fits in one, so a request's first token and each later one both take one "
                f"mixed iteration ({t_mix * 1e3:.2f} ms); --batch B gives a static batch's "
                "latency")
        queued = 0.0
        if clients is not None and each > running:
            # closed loop (Little's law): N clients cycle through the running slots that
            # each take a period to serve a request, so a request waits (N / running − 1)
            # periods for a slot before its prompt is admitted
            queued = period * (each / running - 1)
            ttft += queued
        mem = evolve(mem, kv_in_use=self._kv_per_sequence(memory) * running)
        steady = per_replica
        run = self._request_set(c, chunk, mean_cache, settings, fit, graphs)
        if run is not None:
            per_replica = run.output_tokens_per_s
            self.notes.append(
                f"throughput over {run.requests:,} requests per replica queued at once: "
                f"{run.iterations:,} iterations in {run.total_s:,.1f} s, ramp-up and drain "
                f"included, at most {run.peak_running:,} running (the steady state: "
                f"{steady * p.dp:,.0f} tok/s)")
        throughput = {
            "model": "in-flight batching, steady state (docs/inference-model.md)",
            "engine_max_batch": settings.max_batch,
            "engine_max_num_tokens": settings.max_num_tokens,
            "sequences_fit_in_kv": fit,
            "concurrency": running,
            **({"clients": clients, "queue_wait_ms": queued * 1e3}
               if clients is not None else {}),
            "token_budget_limited": token_limited,
            "prompt_admission_limited": prefill_limited,
            "prompt_tokens_per_mixed_iteration": chunk,
            "mixed_iterations_per_period": n_mixed,
            "decode_iteration_ms": t_gen * 1e3,
            "decode_graph_batch": graph_c,
            "mixed_iteration_ms": t_mix * 1e3,
            "period_ms": period * 1e3,
            "mean_context": mean_cache,
            **({"attention_dp": {(k[:-2] + "_ms" if k.endswith("_s") else k):
                                 (v * 1e3 if k.endswith("_s") else v)
                                 for k, v in adp.items()}} if adp is not None else {}),
            **(run.to_json(steady * p.dp) if run is not None else {}),
        }
        return self._report("max_throughput" if clients is None else "concurrency", running,
                            ttft, tpot, per_replica, fit, mem,
                            (Phase.PREFILL, 1, 0), (Phase.DECODE, c, mean_cache),
                            throughput)

    def _request_set(self, c: int, chunk: int, mean_cache: int, settings: EngineSettings,
                     fit: int, graphs: tuple[int, ...] = ()) -> RequestSetRun | None:
        """The benchmark's finite request set replayed iteration by iteration
        (:mod:`zrt_core.estimate.request_set`), priced from the steady state's decode and
        mixed steps; None without ``num_requests``, with pipeline stages or with chunked
        prefill (vLLM), where the steady state stands."""
        infer = self.infer
        if not infer.num_requests:
            return None
        if self.p.pp > 1 or self.engine.chunked_prefill:
            self.notes.append(
                f"num_requests {infer.num_requests:,} not replayed: the request-set model "
                "covers one pipeline stage without chunked prefill (TensorRT-LLM); the "
                "throughput is the steady state's")
            return None
        dec, mixed = (self.priced(Phase.DECODE, n, mean_cache) for n in (c, c + chunk))
        gen, mix = roles(dec, 1)[0], roles(mixed, 1)[0]
        gen["body"] -= self._hidden(dec[0])
        mix["body"] -= self._hidden(mixed[0])
        cost = IterationCost.from_steps(
            gen, mix, ref_tokens=c, prompt_tokens=chunk, mean_context=mean_cache,
            prompt_attention_s=roles(self.priced(Phase.PREFILL, 1), 1)[0]["attention"],
            host_request_s=self.host_request_s, graph_sizes=graphs)
        # each data-parallel replica (attention DP rank) schedules its share of the set
        max_batch = settings.max_batch
        if infer.concurrency is not None:  # trtllm-bench --concurrency: requests in flight
            max_batch = min(max_batch, math.ceil(infer.concurrency / self.p.dp))
        return simulate_requests(
            requests=math.ceil(infer.num_requests / self.p.dp), input_len=infer.input_len,
            output_len=infer.output_len, max_batch=max_batch,
            max_num_tokens=settings.max_num_tokens, kv_sequences=fit, cost=cost)

    def _attention_dp_iterations(self, c: int, chunk: int, mean_cache: int, n_mixed: float,
                                 t_gen: float, t_mix: float) -> dict[str, float] | None:
        """:func:`~zrt_core.estimate.iterations.attention_dp_iteration` for this layout: None
        where it has no attention DP (experts within the TP group) or pipeline stages."""
        p, osl = self.p, self.infer.output_len
        attention_dp = p.dp > 1 and bench_group_size(p.tp, p.ep, p.expert_tp) > p.tp
        if not attention_dp or p.pp > 1 or not 0 < n_mixed < osl:
            return None
        routed = [routed_expert_s(self.priced(Phase.DECODE, n, mean_cache)[0])
                  for n in (c, c + chunk)]
        out = attention_dp_iteration(t_gen=t_gen, t_mix=t_mix, routed_gen=routed[0],
                                     routed_mix=routed[1], n_mixed=n_mixed, osl=osl,
                                     ranks=p.dp)
        self.notes.append(
            f"attention DP over {p.dp} ranks: an iteration lasts as long as the slowest "
            f"rank's attention, so a prompt on any rank "
            f"({out['any_rank_mixed_fraction']:.0%} of iterations, each rank's own "
            f"{out['rank_mixed_fraction']:.1%}) costs every rank its non-expert part "
            f"({out['delta_attention_s'] * 1e3:.2f} ms); the experts' share "
            f"({out['delta_experts_s'] * 1e3:.2f} ms) is spread over the expert group")
        return out

    def _stage_list(self, phase: str, batch: int, cache_len: int = 0) -> list[float]:
        return [c.total_time_s - self._hidden(c) for c in self.priced(phase, batch, cache_len)]

    def _stage_max(self, phase: str, batch: int, cache_len: int = 0) -> float:
        times = self._stage_list(phase, batch, cache_len)
        return max(times) if self.p.pp > 1 else sum(times)

    def _host_floor(self, what: str, device_s: float, requests: float) -> float:
        """An iteration of ``requests`` scheduled requests takes at least the executor's
        host work for them (its overlap scheduler runs that work beside the previous
        iteration's GPU work: docs/inference-model.md, "The host's share")."""
        host_s = self.host_request_s * requests
        if host_s > device_s:
            self._host_bound.append((what, device_s, host_s, requests))
        return max(device_s, host_s)

    def _host_note(self) -> None:
        if not self._host_bound:
            return
        what, device_s, host_s, requests = self._host_bound[0]
        self.notes.append(
            f"host-bound: a {what} iteration's {requests:,.0f} requests take "
            f"{host_s * 1e3:.2f} ms of the executor's host work "
            f"({self.hw.efficiency.serving_host_request_us:g} µs a request on this host) "
            f"against {device_s * 1e3:.2f} ms on the GPU; the iteration takes the longer")

    def _mixed_iteration(self, gen: int, prompt_tokens: int, cache_len: int
                         ) -> list[float]:
        """An iteration that decodes ``gen`` sequences and prefills ``prompt_tokens``
        prompt tokens: the layers' GEMMs and elementwise work on gen + prompt tokens at
        once, decode attention for the gen sequences, prefill attention for the prompts,
        the LM head only for the gen sequences and the prompts it completes."""
        isl = self.infer.input_len
        prompts = prompt_tokens / isl
        mixed = self.priced(Phase.DECODE, gen + prompt_tokens, cache_len)
        body = roles(mixed, self.p.pp)
        for s, c in enumerate(mixed):  # the body holds the MoE layers' all-to-alls
            body[s]["body"] -= self._hidden(c)
        gen_roles = roles(self.priced(Phase.DECODE, gen, cache_len), self.p.pp)
        prompt = roles(self.priced(Phase.PREFILL, 1), self.p.pp)
        # the head runs on gen + (completed prompts) rows: interpolated between the two
        # priced batches (a GEMM's time is piecewise linear in its rows)
        head_rows = gen + max(1.0, prompts)
        share = (head_rows - gen) / prompt_tokens if prompt_tokens else 0.0
        per_stage = []
        for s in range(len(body)):
            head = gen_roles[s]["head"] + share * (body[s]["head"] - gen_roles[s]["head"])
            per_stage.append(body[s]["body"] + gen_roles[s]["attention"] +
                             prompts * prompt[s]["attention"] + head)
        return per_stage

    def _kv_bytes_model(self) -> tuple[float, float, bool]:
        """The whole model's KV bytes per token, its fixed bytes per request and whether it
        holds recurrent state, as trtllm-bench's heuristic takes them — read from the
        graph's caches: a cache TP splits counts on each of the tp ranks (GQA: 2 × layers ×
        max(tp, kv heads) × head size × KV bytes, heads replicated when tp exceeds them),
        one every rank holds whole counts once (MLA's latent row: layers × (kv_lora_rank +
        rope dim) × KV bytes, as trtllm-bench counts it); sliding-window layers count as
        full layers (trtllm-bench does not know windows); SSM and convolution states are
        its "extra cache" per request."""
        captured = self.cap.graph(Phase.DECODE)
        rank = self.graph(Phase.DECODE, 1, self.infer.input_len, kernels=False)
        shapes = {t.tensor_id: t.shape[1:] for n in captured.nodes for t in n.inputs
                  if t.tensor_id in self.caches}
        factors = {}
        for n in rank.nodes:
            for t in n.inputs:
                if t.tensor_id in shapes and t.tensor_id not in factors:
                    factors[t.tensor_id] = 1 if t.shape[1:] == shapes[t.tensor_id] else self.p.tp
        kv = kv_cache_size(rank, None, caches=self.caches, factors=factors)
        return kv.per_token + kv.window_row_bytes, kv.recurrent_fixed, kv.recurrent

    # -- the report --------------------------------------------------------------------

    def _report(self, mode: str, batch: int, ttft: float, tpot: float, per_replica: float,
                max_batch: int, mem: MemoryReport, prefill_key: tuple[str, int, int],
                decode_key: tuple[str, int, int], throughput: Mapping[str, Any]
                ) -> InferenceReport:
        self._host_note()
        p = self.p
        world = p.world_size
        total = per_replica * p.dp
        prefill = self._breakdown(*prefill_key)
        decode = self._breakdown(*decode_key)
        timelines = {"prefill": self._timeline(*prefill_key),
                     "decode": self._timeline(*decode_key)}
        g = self.graph(*decode_key)
        infer = self.infer
        return InferenceReport(
            model=self.cap.name, model_type=self.cap.model_type, hardware_id=self.hw.id,
            hardware_name=self.hw.name,
            parallel={**p.to_json(), "describe": p.describe()},
            workload={**infer.to_json(), "kv_dtype": self.kv_dtype or infer.dtype},
            engine=self.engine.name, mode=mode, num_gpus=world, batch=int(batch),
            ttft_s=ttft, tpot_s=tpot, output_tokens_per_s=total,
            output_tokens_per_s_per_gpu=total / world,
            requests_per_s=total / infer.output_len, max_batch=int(max_batch), memory=mem,
            prefill=prefill, decode=decode, throughput=throughput,
            params={"total": self.cap.total_params, "active": self.cap.active_params,
                    "tp_plan": self.cap.tp_plan.source},
            notes=tuple(self.notes) + tuple(self.cap.warnings[:5]),
            transforms=tuple(g.meta.get("transforms", ())), timelines=timelines)

    def _breakdown(self, phase: str, batch: int, cache_len: int) -> PhaseBreakdown:
        from zrt_core.cost.coverage import coverage as price_coverage

        costed = self.priced(phase, batch, cache_len)
        g = self.graph(phase, batch, cache_len)
        by_cat: dict[str, float] = {}
        by_kind: dict[str, float] = {}
        coverage: dict[str, float] = {}
        total = 0.0
        flops = nbytes = 0
        collectives: dict[str, dict[str, float]] = {}
        for c in costed:
            total += c.total_time_s
            for k, v in c.time_by_category.items():
                by_cat[k] = by_cat.get(k, 0.0) + v
            for k, v in c.time_by_layer_kind.items():
                by_kind[k] = by_kind.get(k, 0.0) + v
            for k, v in c.coverage.time.items():
                coverage[k] = coverage.get(k, 0.0) + v * c.total_time_s
            for n in c.graph.nodes:
                m = c.graph.multiplicity(n)
                flops += n.flops * m
                nbytes += n.bytes * m
                if n.category == Category.COLLECTIVE:
                    key = f"{n.attrs.get('group')}/{n.attrs.get('collective')}"
                    entry = collectives.setdefault(key, {"count": 0, "bytes": 0,
                                                         "time_s": 0.0})
                    entry["count"] += m
                    entry["bytes"] += int(n.attrs.get("bytes", 0)) * m
                    entry["time_s"] += c.cost(n).time_s * m
        counts = {t.kind: t.count for t in g.templates.values()}
        per_layer = {k: by_kind.get(k, 0.0) / n for k, n in counts.items() if n}
        tokens = batch * (self.infer.input_len if phase == Phase.PREFILL else 1)
        return PhaseBreakdown(
            phase=phase, batch=batch, tokens=tokens, time_s=total, flops=flops,
            bytes=nbytes, by_category_s=by_cat, by_layer_kind_s=by_kind,
            per_layer_s=per_layer, layer_counts=counts, collectives=collectives,
            coverage={k: v / total for k, v in coverage.items()} if total else {},
            price_coverage=price_coverage(costed))

    def _timeline(self, phase: str, batch: int, cache_len: int) -> Timeline | None:
        from zrt_core.schedule.scheduler import OverlapRules, schedule_phase

        costed = self.priced(phase, batch, cache_len)[0]
        graph, rules = costed.graph, OverlapRules.serving()
        if self.infer.shared_expert_overlap and self.p.ep > 1:
            from zrt_core.estimate.shared_experts import shared_experts_issued_early

            graph, rules = shared_experts_issued_early(graph), OverlapRules.serving(
                ep_async=True)
        try:
            return schedule_phase(graph, costed.costs, rules)
        except ZrtError:
            return None


class _CachedBackends:
    """The contributed backends behind one price cache: a node priced for one step is not
    priced again for another (the key is ``node_price_key``: op, FLOPs, bytes, shapes,
    attrs — never ids). The cache lives per hardware spec across estimates, so
    re-estimating another layout reuses every node price the layouts share."""

    name = "cached"

    def __init__(self, hw: HardwareSpec, backends: list[Any]) -> None:
        self.backends = backends
        key = (hw, tuple(b.name for b in backends))
        cache = _PRICE_CACHES.get(key)
        if cache is None:
            if len(_PRICE_CACHES) > 8:
                _PRICE_CACHES.clear()
            cache = _PRICE_CACHES[key] = {}
        self.cache: dict[Any, Any] = cache

    def price(self, node: Any) -> Any:
        return self.price_keyed(node, node_price_key(node))

    def price_keyed(self, node: Any, key: Any) -> Any:
        """:meth:`price` with the node's ``node_price_key`` (or its repr) given."""
        try:
            hit = self.cache.get(key)
        except TypeError:
            key = repr(key)
            hit = self.cache.get(key)
        if hit is not None:
            return hit
        for b in self.backends:
            cost = b.price(node)
            if cost is not None:
                if len(self.cache) > 200_000:
                    self.cache.clear()
                self.cache[key] = cost
                return cost
        return None


_PRICE_CACHES: dict[Any, dict[Any, Any]] = {}


def _stage_weights(graphs: list[OpGraph], layers: set[int], plan: PipelinePlan,
                   rank_layers: list[set[int]]) -> float:
    """Weights one pipeline rank holds: its stages' layers, plus the embedding and head
    parameters when it runs the first or last stage."""
    first = plan.stages[0].layers
    last = plan.stages[-1].layers
    holds_embedding = any(first[0] in s for s in rank_layers)
    holds_head = any(last[-1] in s for s in rank_layers)
    total = float(weights_bytes(graphs, layers))
    outside = _outside_weights(graphs)
    total -= outside["embedding"] + outside["head"]
    if holds_embedding:
        total += outside["embedding"]
    if holds_head:
        total += outside["head"]
    return total


def _outside_weights(graphs: list[OpGraph]) -> dict[str, float]:
    """Bytes of parameters read outside the layers, on the embedding side and head side."""
    from zrt_core.transforms.quant import weight_bytes

    seen: set[str] = set()
    out = {"embedding": 0.0, "head": 0.0}
    for g in graphs:
        pos = [i for i, n in enumerate(g.nodes) if n.layer_index is not None]
        first, last = (pos[0], pos[-1]) if pos else (len(g.nodes), -1)
        for i, n in enumerate(g.nodes):
            if n.layer_index is not None:
                continue
            side = "embedding" if i < first else ("head" if i > last else None)
            if side is None:
                continue
            for t in n.inputs:
                if t.param is not None and t.param not in seen:
                    seen.add(t.param)
                    out[side] += weight_bytes(t)
    return out


def _engine_bytes_per_param(infer: InferSpec) -> float:
    """trtllm-bench's bytes per parameter for its engine-size estimate."""
    return {"fp8": 1.0, "fp4": 0.5, "int8": 1.0, "int4": 0.5}.get(
        infer.quant, dtype_bytes(infer.dtype))


def _fusion_transform() -> Any:
    """The fusion transform for the context's platform, when zrt provides one."""
    try:
        from zrt_core.transforms.fusion import Fusion
    except ImportError:
        return None
    return Fusion()


__all__ = ["OUTSIDE_LAYERS", "estimate_inference"]
