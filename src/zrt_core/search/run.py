"""``search()``: enumerate a space, drop what the rules remove, estimate the rest (serially,
in local processes or as Ray tasks), rank, and build the fronts; the result is JSON-able."""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from attrs import field, frozen

from zrt_core.errors import SpecError
from zrt_core.search.collector import rare_collections
from zrt_core.search.pareto import pareto_front
from zrt_core.search.space import (
    SERVE_RULES,
    TRAIN_RULES,
    ServeSpace,
    TrainSpace,
    enumerate_serve,
    enumerate_train,
    no_layout_error,
    train_space_size,
)

Progress = Callable[[int, int], None]


@frozen
class SearchResult:
    """What a search found. ``rows`` holds every estimated layout (its layout fields and its
    report fields); ``ranking``, ``pareto`` and ``gpus_front`` index into it."""

    mode: str
    model: str
    hardware: str
    enumerated: int
    rejected: dict[str, int]
    rows: tuple[dict[str, Any], ...]
    ranking: tuple[int, ...]
    pareto: tuple[int, ...]
    gpus_front: tuple[int, ...] = ()
    winner_report: dict[str, Any] | None = None
    winner_spec: Any = field(default=None, eq=False)
    #: the winner's report object (TrainingReport / InferenceReport), not in the JSON
    winner_report_object: Any = field(default=None, eq=False, repr=False)
    extra: dict[str, Any] = field(factory=dict)
    elapsed_s: float = 0.0
    partial: bool = False
    top_k: int = 10

    @property
    def evaluated(self) -> int:
        return len(self.rows)

    @property
    def winner(self) -> dict[str, Any] | None:
        return self.rows[self.ranking[0]] if self.ranking else None

    def to_json(self) -> dict[str, Any]:
        """The shape ``zrt search --json`` prints (``evaluated``, ``rejected``, ``results``
        the ranked top-k, ``pareto`` the front, ``winner`` with its full report)."""
        return {
            "mode": self.mode, "model": self.model, "hardware": self.hardware,
            "enumerated": self.enumerated, "evaluated": self.evaluated,
            "rejected": dict(self.rejected),
            "results": [self.rows[i] for i in self.ranking[:self.top_k]],
            "pareto": [self.rows[i] for i in self.pareto],
            "gpus_front": [self.rows[i] for i in self.gpus_front],
            "winner": self.winner, "winner_report": self.winner_report,
            **self.extra,
            "elapsed_s": self.elapsed_s, "partial": self.partial,
        }


#: why an attention-DP winner of an MoE serving search is an upper bound: docs/search.md,
#: "Serving: TensorRT-LLM's published layouts"
ATTENTION_DP_MOE_NOTE = (
    "the best layout runs attention data-parallel for an MoE model: zrt predicts "
    "TensorRT-LLM's published MoE runs read that way 43-77% faster than they measured "
    "(docs/search.md), so its gain over tensor-parallel attention is an upper bound")


def _nvlink(hw: Any) -> int | None:
    return hw.interconnect[0].devices if hw.interconnect else None


def search(model: Any, hardware: Any, space: TrainSpace | ServeSpace, *, top_k: int = 10,
           ttft_ms: float | None = None, tpot_ms: float | None = None,
           rate: float | None = None, engine: str = "trtllm", workers: int = 1,
           ray_address: str | None = None, host: Any = None, use_cache: bool | None = None,
           progress: Progress | None = None, full_report: bool = True,
           objective: str = "throughput", run: Any = None,
           exact: bool | None = None) -> SearchResult:
    """Search ``space`` for ``model`` on ``hardware`` (an id or a spec).

    Training (a :class:`TrainSpace`) ranks the layouts that fit by tokens/s per GPU (step
    time, for one GPU count); the front is tokens/s per GPU against memory per device, and
    with several GPU counts a second front of step time against GPUs. Serving (a
    :class:`ServeSpace`) ranks the layouts that fit and meet ``ttft_ms``/``tpot_ms`` by
    output tokens/s per GPU; the front is tokens/s per GPU against tokens/s per user;
    ``rate`` (requests/s) adds the fewest GPUs that sustain it within the targets.
    ``run`` (a :class:`zrt_core.goodput.GoodputSpec`) adds each training row's goodput and
    time to train; ``objective`` (``throughput``, ``goodput``, ``time-to-train``;
    :mod:`zrt_core.search.objective`) ranks by one of them.

    :param workers: local processes (1: in this process).
    :param ray_address: run the estimates as Ray tasks (``"auto"`` or ``"local"``: a local
        instance); needs ``zrt-core[ray]``.
    :param exact: estimate every training layout exactly (True), or screen them in closed
        form and estimate exactly only those the screen cannot rule out of the top-k, the
        best per GPU count or the front (:mod:`zrt_core.search.screen`; the default where
        it saves work: one process, ranking by throughput).
    :raises LayoutError: no layout of the space is valid (names the rule that removed most).
    """
    from zrt_core.plugins import get_plugin_manager

    started = time.perf_counter()
    model = _plain(model)  # a read-only config mapping cannot go to worker processes
    host = host or get_plugin_manager()
    hw = host.hardware_spec(hardware) if isinstance(hardware, str) else hardware
    config, where = _config(model, host)
    from zrt_core.checks import check_config

    dims = check_config(config, where=where)
    train = isinstance(space, TrainSpace)
    from zrt_core.search.objective import add_goodput, check_objective, rank_key

    check_objective(objective, run, train, hw)
    if train:
        from zrt_core.checks import check_tokens

        check_tokens(config, space.seq_len, "a training sequence", where=where)
        cands, removed = enumerate_train(space, dims, _nvlink(hw))
        enumerated = train_space_size(space, dims)
        rules: tuple[tuple[str, str], ...] = TRAIN_RULES
        args: tuple[Any, ...] = ("train", model, hw, space.global_batch, space.seq_len,
                                 engine, use_cache, space.mtp)
    else:
        from zrt_core.checks import check_tokens

        check_tokens(config, space.input_len + space.output_len, "a served sequence",
                     where=where)
        low = frozenset(p for p in ("fp8", "fp4")
                        if getattr(hw.compute, f"{p}_tflops", None))
        cands, removed = enumerate_serve(space, dims, _nvlink(hw), low)
        enumerated = len(cands) + sum(removed.values())
        rules = SERVE_RULES
        args = ("infer", model, hw, space.input_len, space.output_len, engine, use_cache, 0)
    if not cands:
        raise no_layout_error(removed, rules)
    if exact is not None and not train:
        raise SpecError("--exact applies to a training search (serving estimates every "
                        "layout exactly)", "drop --exact or search with --train")
    screen_info: dict[str, Any] | None = None
    if train and _screens(exact, workers, ray_address, objective, cands):
        rows, partial, screen_info = _screened(args, cands, top_k, progress, host)
    else:
        rows, partial = _evaluate(args, cands, workers, ray_address, progress, host)
    rejected: Counter[str] = Counter(removed)
    kept: list[dict[str, Any]] = []
    kept_cands: list[Any] = []
    for i, row in rows:
        cand = cands[i]
        if "rejected" in row:
            rejected[row["rejected"]] += 1
        else:
            kept.append(row)
            kept_cands.append(cand)
    memory = sum(1 for r in kept if not r["fits"])
    if memory:
        rejected["memory"] = memory
    extra: dict[str, Any] = {}
    if train:
        extra["screened"] = screen_info["screened"] if screen_info else 0
        if screen_info and screen_info["memory_screened"]:
            rejected["memory (screened)"] = screen_info["memory_screened"]
        extra["estimated_exactly"] = len(rows)
        if screen_info:
            extra["screen"] = screen_info
        if run is not None:
            add_goodput(kept, hw, run, space.global_batch, space.seq_len)
        if objective != "throughput":
            extra["objective"] = objective
        ranking = sorted((i for i, r in enumerate(kept) if r["fits"]),
                         key=rank_key(objective, kept))
        fitting = [kept[i] for i in ranking]
        front = [ranking[j] for j in pareto_front(fitting, "tokens_per_s_per_gpu",
                                                  "memory_gib", y_max=False)]
        gpus_front = _gpus_front(kept, ranking) if len(space.gpus) > 1 else []
    else:
        ranking, front, extra = _rank_serving(kept, ttft_ms, tpot_ms, rate)
        from zrt_core.search.disagg import disaggregated

        split = disaggregated(kept, hw, space.output_len, ttft_ms=ttft_ms, tpot_ms=tpot_ms)
        extra["disaggregated"] = split
        if split and ranking:
            # disaggregated over aggregated, output tokens/s per GPU (> 1: split wins)
            extra["disaggregated_over_aggregated"] = (
                split["output_tokens_per_s_per_gpu"]
                / kept[ranking[0]]["output_tokens_per_s_per_gpu"])
        gpus_front = []
        if dims.is_moe and ranking and kept[ranking[0]]["dp"] > 1:
            extra["notes"] = [ATTENTION_DP_MOE_NOTE]
        latency = sum(1 for r in kept if r["fits"] and not r["meets_targets"])
        if latency:
            rejected["latency_targets"] = latency
    if not ranking and not partial:
        # every layout removed: by a rule, the estimator's checks, memory or the targets
        raise no_layout_error(rejected, (*rules, (
            "latency_targets", "TTFT and TPOT within --ttft-ms and --tpot-ms")))
    winner_report = winner_object = winner_spec = None
    if ranking:
        best = kept_cands[ranking[0]]
        winner_spec = _winner_spec(best, space)
        if full_report:
            winner_object = _report(args, host, best)
            if train and run is not None:
                from attrs import evolve

                from zrt_core.estimate.goodput import training_goodput

                winner_object = evolve(winner_object,
                                       goodput=training_goodput(winner_object, hw, run))
            winner_report = _jsonable(winner_object.to_json())
    return SearchResult(
        mode="train" if train else "infer", model=str(where), hardware=hw.id,
        enumerated=enumerated, rejected=dict(sorted(rejected.items())), rows=tuple(kept),
        ranking=tuple(ranking), pareto=tuple(front), gpus_front=tuple(gpus_front),
        winner_report=winner_report, winner_spec=winner_spec,
        winner_report_object=winner_object, extra=extra,
        elapsed_s=time.perf_counter() - started, partial=partial, top_k=top_k)


def _screens(exact: bool | None, workers: int, ray_address: str | None, objective: str,
             cands: Sequence[Any]) -> bool:
    """Whether the two-tier search runs: not asked exact, in one process, ranking by
    throughput, and more layouts than the screen's anchors (one estimated exactly per
    layer group and sharding: with fewer layouts the screen saves nothing)."""
    if exact or workers != 1 or ray_address is not None or objective != "throughput":
        return False
    from zrt_core.search.screen import anchors_needed

    return len(cands) > 2 * anchors_needed(cands)


def _screened(args: tuple[Any, ...], cands: Sequence[Any], top_k: int,
              progress: Progress | None, host: Any
              ) -> tuple[list[tuple[int, dict[str, Any]]], bool, dict[str, Any]]:
    from zrt_core.search.screen import two_tier

    evaluator = _make_evaluator(args, host)
    res = two_tier(evaluator, cands, top_k=top_k, progress=progress)
    return res.rows, res.partial, res.summary(len(cands))


def _plain(value: Any) -> Any:
    """Mappings (read-only ones included) as dicts, recursively; anything else as is."""
    from collections.abc import Mapping

    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_plain(v) for v in value)
    return value


def _jsonable(data: Any) -> Any:
    """Plain JSON types only (a report's mappings and tuples), so a service can store it."""
    import json

    return json.loads(json.dumps(data, default=lambda v: dict(v) if hasattr(v, "items")
                                 else list(v) if isinstance(v, tuple | set | frozenset)
                                 else str(v)))


def _config(model: Any, host: Any) -> tuple[Any, str]:
    from zrt_core.capture.sources import raw_config

    return raw_config(model, host)


def _winner_spec(cand: Any, space: Any) -> dict[str, Any]:
    """The winner as the values ``zrt run`` builds: ``parallel`` and ``train`` or ``infer``
    (for ``--emit`` to a framework's config)."""
    from zrt_core.search.evaluate import infer_spec, train_spec

    if isinstance(space, TrainSpace):
        return {"parallel": cand.parallel, "num_gpus": cand.gpus,
                "train": train_spec(cand, space.global_batch, space.seq_len)}
    return {"parallel": cand.parallel, "num_gpus": cand.gpus,
            "infer": infer_spec(cand, space.input_len, space.output_len)}


def _gpus_front(rows: Sequence[dict[str, Any]], ranking: Sequence[int]) -> list[int]:
    """The best layout per GPU count, then the front of step time against GPUs (fewer GPUs
    or a shorter step)."""
    best: dict[int, int] = {}
    for i in ranking:
        g = rows[i]["gpus"]
        if g not in best or rows[i]["step_time_s"] < rows[best[g]]["step_time_s"]:
            best[g] = i
    picks = sorted(best.values(), key=lambda i: rows[i]["gpus"])
    chosen = [rows[i] for i in picks]
    return [picks[j] for j in pareto_front(chosen, "gpus", "step_time_s", x_max=False,
                                           y_max=False)]


def _rank_serving(rows: list[dict[str, Any]], ttft_ms: float | None, tpot_ms: float | None,
                  rate: float | None) -> tuple[list[int], list[int], dict[str, Any]]:
    for r in rows:
        r["meets_targets"] = bool(r["fits"]) and \
            (ttft_ms is None or r["ttft_ms"] <= ttft_ms) and \
            (tpot_ms is None or r["tpot_ms"] <= tpot_ms)
    ranking = sorted((i for i, r in enumerate(rows) if r["meets_targets"]),
                     key=lambda i: (-rows[i]["output_tokens_per_s_per_gpu"], i))
    fitting = [i for i, r in enumerate(rows) if r["fits"]]
    front = [fitting[j] for j in pareto_front([rows[i] for i in fitting],
                                              "output_tokens_per_s_per_gpu",
                                              "tokens_per_s_per_user")]
    extra: dict[str, Any] = {"targets": {"ttft_ms": ttft_ms, "tpot_ms": tpot_ms}}
    if rate is not None:
        extra["rate"] = _fewest_gpus(rows, ranking, rate)
    return ranking, front, extra


def _fewest_gpus(rows: Sequence[dict[str, Any]], ranking: Sequence[int],
                 rate: float) -> dict[str, Any] | None:
    """The fewest GPUs that sustain ``rate`` requests/s: replicas of one layout that meets
    the targets, ``ceil(rate / requests_per_s)`` of them."""
    best = None
    for i in ranking:
        r = rows[i]
        if r["requests_per_s"] <= 0:
            continue
        replicas = math.ceil(rate / r["requests_per_s"])
        total = replicas * r["gpus"]
        if best is None or total < best["gpus"]:
            best = {"requests_per_s": rate, "gpus": total, "replicas": replicas,
                    "layout": r}
    return best


# -- evaluation: serial, processes, Ray -----------------------------------------------------

_EVALUATOR: Any = None


def _make_evaluator(args: tuple[Any, ...], host: Any = None) -> Any:
    from zrt_core.search.evaluate import ServeEvaluator, TrainEvaluator

    kind, model, hw, a, b, engine, use_cache, mtp = args
    if kind == "train":
        return TrainEvaluator(model, hw, a, b, host=host, use_cache=use_cache, mtp=mtp)
    return ServeEvaluator(model, hw, a, b, engine=engine, host=host, use_cache=use_cache)


def _init_worker(args: tuple[Any, ...]) -> None:
    global _EVALUATOR
    _EVALUATOR = _make_evaluator(args)


def _rows_of(chunk: Sequence[tuple[int, Any]]) -> list[tuple[int, dict[str, Any]]]:
    with rare_collections():
        return [(i, _EVALUATOR.row(c)) for i, c in chunk]


def _report(args: tuple[Any, ...], host: Any, cand: Any) -> Any:
    return _make_evaluator(args, host).report(cand)


def _chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _evaluate(args: tuple[Any, ...], cands: Sequence[Any], workers: int,
              ray_address: str | None, progress: Progress | None, host: Any
              ) -> tuple[list[tuple[int, dict[str, Any]]], bool]:
    """``(candidate index, row)`` in candidate order, and whether the run was interrupted
    (then only the candidates evaluated before it)."""
    if workers < 1:
        raise SpecError(f"--workers must be at least 1, got {workers}", "use --workers 1 or more")
    total = len(cands)
    visit = _visit_order(args, cands)
    if ray_address is not None:
        return _evaluate_ray(args, visit, ray_address, progress)
    if workers == 1:
        evaluator = _make_evaluator(args, host)
        rows: list[tuple[int, dict[str, Any]]] = []
        try:
            with rare_collections():
                for i, c in visit:
                    rows.append((i, evaluator.row(c)))
                    if progress:
                        progress(len(rows), total)
        except KeyboardInterrupt:
            return sorted(rows, key=lambda r: r[0]), True
        return sorted(rows, key=lambda r: r[0]), False
    import concurrent.futures as cf
    import multiprocessing

    # capture once here (the disk cache), so every worker loads instead of capturing
    _prime(args, cands, host)
    size = max(1, min(256, total // (workers * 8) or 1))
    chunks = _chunks(visit, size)
    results: dict[int, list[tuple[int, dict[str, Any]]]] = {}
    pool = cf.ProcessPoolExecutor(max_workers=workers, initializer=_init_worker,
                                  initargs=(args,),
                                  mp_context=multiprocessing.get_context("spawn"))
    done = 0
    try:
        futures = {pool.submit(_rows_of, ch): k for k, ch in enumerate(chunks)}
        for fut in cf.as_completed(futures):
            results[futures[fut]] = fut.result()
            done += len(results[futures[fut]])
            if progress:
                progress(done, total)
    except KeyboardInterrupt:
        pool.shutdown(wait=False, cancel_futures=True)
        return _ordered(results), True
    pool.shutdown()
    return _ordered(results), False


def _ordered(results: dict[int, list[tuple[int, dict[str, Any]]]]
             ) -> list[tuple[int, dict[str, Any]]]:
    """The rows back in the candidates' order."""
    return sorted((row for rows in results.values() for row in rows), key=lambda r: r[0])


def _visit_order(args: tuple[Any, ...], cands: Sequence[Any]) -> list[tuple[int, Any]]:
    """``(index, candidate)`` in the order to estimate them: training candidates group by
    group (:func:`~zrt_core.search.evaluate.layer_group`), so one process makes each
    group's per-layer graphs once and every chunk of a pool holds few groups; the rows go
    back in the candidates' order."""
    indexed = list(enumerate(cands))
    if args[0] != "train":
        return indexed
    from zrt_core.search.evaluate import layer_group

    return sorted(indexed, key=lambda ic: (layer_group(ic[1]), ic[0]))


def _prime(args: tuple[Any, ...], cands: Sequence[Any], host: Any) -> None:
    evaluator = _make_evaluator(args, host)
    if args[0] == "train":
        for key in sorted({(c.micro_batch, c.precision) for c in cands}):
            evaluator.capture(*key)
    else:
        evaluator.capture()


def _evaluate_ray(args: tuple[Any, ...], visit: Sequence[tuple[int, Any]], address: str,
                  progress: Progress | None) -> tuple[list[tuple[int, dict[str, Any]]], bool]:
    try:
        import ray
    except ImportError:
        raise SpecError("--ray needs Ray, which is not installed",
                        "pip install 'zrt-core[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=None if address in ("", "local") else address,
                 ignore_reinit_error=True, include_dashboard=False, log_to_driver=False)

    @ray.remote
    def rows_of(a: tuple[Any, ...], chunk: Sequence[tuple[int, Any]]
                ) -> list[tuple[int, dict[str, Any]]]:
        _init_worker(a)
        return _rows_of(chunk)

    chunks = _chunks(visit, max(1, min(256, len(visit) // 64 or 1)))
    refs = [rows_of.remote(args, ch) for ch in chunks]
    index = {ref: k for k, ref in enumerate(refs)}
    results: dict[int, list[tuple[int, dict[str, Any]]]] = {}
    pending = list(refs)
    done = 0
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                results[index[ref]] = ray.get(ref)
                done += len(results[index[ref]])
                if progress:
                    progress(done, len(visit))
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref)
        return _ordered(results), True
    return _ordered(results), False
