"""Estimate one candidate layout with the estimators ``zrt run`` uses, from captures made
once per model and workload and reused for every layout; a result is a flat JSON-able row.
"""

from __future__ import annotations

from typing import Any

from zrt_core.errors import ZrtError
from zrt_core.search.space import SHARDING, ServeCandidate, TrainCandidate
from zrt_core.strategy import InferSpec, TrainSpec

GIB = 2.0 ** 30


#: how a training candidate's layers split into stages (``estimate_training``'s
#: ``stage_split``): the even split where it exists, as before
STAGE_SPLIT = "auto"


def train_spec(cand: TrainCandidate, global_batch: int, seq_len: int) -> TrainSpec:
    """The :class:`TrainSpec` ``zrt run --train`` builds for this candidate."""
    from zrt_core.strategy import train_spec_defaults

    zero, fsdp = SHARDING[cand.sharding]
    return train_spec_defaults(
        cand.parallel, micro_batch=cand.micro_batch, global_batch=global_batch,
        seq_len=seq_len, recompute=cand.recompute, zero=zero, fsdp=fsdp,
        precision=cand.precision, pp_schedule=cand.pp_schedule,
        grad_reduce_in_fp32=cand.grad_reduce_in_fp32, quantized_params=cand.quantized_params)


def layer_group(cand: TrainCandidate) -> tuple[Any, ...]:
    """What decides a training candidate's per-layer graphs: candidates evaluated group by
    group reuse them (:class:`TrainEvaluator`)."""
    p = cand.parallel
    return (cand.micro_batch, cand.precision, p.tp, p.cp, p.ep, p.expert_tp, cand.recompute)


def infer_spec(cand: ServeCandidate, input_len: int, output_len: int) -> InferSpec:
    """The :class:`InferSpec` ``zrt run --infer`` builds (fp8 KV cache with fp8/fp4)."""
    kv = "fp8" if cand.quant in ("fp8", "fp4") else None
    return InferSpec(input_len=input_len, output_len=output_len, batch=cand.batch,
                     quant=cand.quant, kv_dtype=kv)


class TrainEvaluator:
    """Prices training candidates of one model on one machine. Captures one micro-batch per
    (micro-batch size, capture dtype) once and hands it to every estimate, and shares the
    per-layer graphs and node prices across layouts (:mod:`zrt_core.estimate.training.
    reuse`: the same results as estimating each layout alone)."""

    #: share per-layer work across layouts (False: every estimate from scratch)
    reuse_layers = True

    def __init__(self, model: Any, hardware: Any, global_batch: int, seq_len: int, *,
                 host: Any = None, use_cache: bool | None = None, mtp: int = 0) -> None:
        from zrt_core.plugins import get_plugin_manager

        self.model = model
        #: MTP depths every candidate trains (:attr:`TrainSpace.mtp`)
        self.mtp = mtp
        self._mtp_spec: Any = None
        self.host = host or get_plugin_manager()
        self.hw = (self.host.hardware_spec(hardware) if isinstance(hardware, str)
                   else hardware)
        self.global_batch = global_batch
        self.seq_len = seq_len
        self.use_cache = use_cache
        self._captures: dict[tuple[int, str], Any] = {}
        # the per-layer graphs and node prices layouts share (same results as without)
        from zrt_core.estimate.training.reuse import TrainingReuse

        self.reuse = TrainingReuse()

    def capture(self, micro_batch: int, precision: str) -> Any:
        from zrt_core.estimate.training import capture_dtype, capture_for_training

        key = (micro_batch, capture_dtype(precision))
        if key not in self._captures:
            self._captures[key] = capture_for_training(
                self.model, micro_batch, self.seq_len, dtype=key[1], host=self.host,
                use_cache=self.use_cache)
        return self._captures[key]

    def report(self, cand: TrainCandidate, *, keep_timelines: bool = False) -> Any:
        """The full :class:`TrainingReport` of one candidate (what ``zrt run --train``
        prints)."""
        from zrt_core.estimate.training import estimate_training

        train = train_spec(cand, self.global_batch, self.seq_len)
        captured = self.capture(cand.micro_batch, cand.precision)
        # the split the space's pp_layers rule admits: even, else Megatron-Core's
        # embedding/loss accounting, else the balanced layout (zrt run --stage-split auto)
        return estimate_training(self.model, self.hw, cand.parallel, train, host=self.host,
                                 captured=captured, num_gpus=cand.gpus,
                                 keep_timelines=keep_timelines,
                                 reuse=self.reuse if self.reuse_layers else None,
                                 stage_split=self._split(cand),
                                 mtp=self.mtp_spec(captured))

    def dims(self, micro_batch: int, precision: str) -> Any:
        """The model's :class:`~zrt_core.modelinfo.ModelDims` as the estimator reads them
        from this capture (its own, else from its config)."""
        captured = self.capture(micro_batch, precision)
        dims = getattr(captured, "dims", None)
        if dims is None:
            from zrt_core.modelinfo import ModelDims

            dims = ModelDims.from_config(dict(captured.config))
        return dims

    def _split(self, cand: TrainCandidate) -> str:
        """``"even"`` where the layers split evenly over the candidate's stages (the plan
        ``"auto"`` gives too, without the report's layout note), else ``"auto"``."""
        layers = self.dims(cand.micro_batch, cand.precision).layers
        p = cand.parallel
        stages = p.pp * (p.vp if cand.pp_schedule == "interleaved" else 1)
        return "even" if layers % stages == 0 else STAGE_SPLIT

    def mtp_spec(self, captured: Any) -> Any:
        """The :class:`~zrt_core.estimate.training.MtpSpec` of :attr:`mtp` depths for the
        captured model (``zrt run --mtp``'s), None without MTP."""
        if not self.mtp:
            return None
        if self._mtp_spec is None:
            from zrt_core.estimate.training import mtp_at_depths

            self._mtp_spec = mtp_at_depths(dict(captured.config), self.mtp)[1]
        return self._mtp_spec

    def row(self, cand: TrainCandidate) -> dict[str, Any]:
        """The candidate's flat row; ``rejected`` names the estimator's check when it
        refused the layout (a rule the space's own rules do not model)."""
        return self.row_and_report(cand)[0]

    def row_and_report(self, cand: TrainCandidate) -> tuple[dict[str, Any], Any]:
        """:meth:`row` and the report it came from (None when the estimator refused)."""
        out = cand.to_json()
        try:
            r = self.report(cand)
        except ZrtError as exc:
            out["rejected"] = f"estimator: {type(exc).__name__}: {str(exc).split(' — ')[0]}"
            return out, None
        mem = r.memory
        out.update({
            "step_time_s": r.step_time_s,
            "tokens_per_s_per_gpu": r.tokens_per_s_per_gpu,
            "tokens_per_s": r.tokens_per_s_per_gpu * cand.gpus,
            "mfu": r.mfu, "hfu": r.hfu,
            "bubble_fraction": r.bubble_fraction,
            "exposed_comm_s": r.exposed_comm_total_s,
            "optimizer_s": r.optimizer_s,
            "microbatches": r.microbatches,
            "schedule": r.schedule,
            "memory_gib": mem.peak_bytes / GIB if mem else None,
            "usable_gib": mem.usable_bytes / GIB if mem else None,
            "fits": r.feasible,
            "checkpoint_bytes": r.checkpoint_bytes,
            "checkpoint_bytes_per_device": r.checkpoint_bytes_per_device,
        })
        return out, r


class ServeEvaluator:
    """Prices serving candidates: one prefill/decode capture at the prompt length, reused."""

    def __init__(self, model: Any, hardware: Any, input_len: int, output_len: int, *,
                 engine: str = "trtllm", host: Any = None,
                 use_cache: bool | None = None) -> None:
        from zrt_core.plugins import get_plugin_manager

        self.model = model
        self.host = host or get_plugin_manager()
        self.hw = (self.host.hardware_spec(hardware) if isinstance(hardware, str)
                   else hardware)
        self.input_len = input_len
        self.output_len = output_len
        self.engine = engine
        self.use_cache = use_cache
        self._captured: Any = None

    def capture(self) -> Any:
        from zrt_core.estimate import load_or_capture

        if self._captured is None:
            self._captured = load_or_capture(self.model, self.input_len, host=self.host,
                                             use_cache=self.use_cache)
        return self._captured

    def report(self, cand: ServeCandidate) -> Any:
        from zrt_core.estimate import estimate_inference

        infer = infer_spec(cand, self.input_len, self.output_len)
        return estimate_inference(self.model, self.hw, cand.parallel, infer, host=self.host,
                                  captured=self.capture(), engine=self.engine)

    def row(self, cand: ServeCandidate) -> dict[str, Any]:
        out = cand.to_json()
        try:
            r = self.report(cand)
        except ZrtError as exc:
            out["rejected"] = f"estimator: {type(exc).__name__}: {str(exc).split(' — ')[0]}"
            return out
        mem = r.memory
        prefill, decode = r.prefill, r.decode
        out.update({
            # the batch the engine runs ("batch" stays the one asked for: a number or max)
            "running_batch": r.batch, "mode": r.mode,
            "ttft_ms": r.ttft_s * 1e3, "tpot_ms": r.tpot_s * 1e3,
            # one user's decode speed: a token every TPOT
            "tokens_per_s_per_user": 1.0 / r.tpot_s if r.tpot_s > 0 else 0.0,
            "output_tokens_per_s": r.output_tokens_per_s,
            "output_tokens_per_s_per_gpu": r.output_tokens_per_s_per_gpu,
            "requests_per_s": r.requests_per_s,
            "memory_gib": mem.total_in_use / GIB if mem else None,
            "kv_bytes_per_sequence": mem.kv_per_sequence if mem else 0.0,
            "prefill_step_s": prefill.time_s if prefill else None,
            "prefill_batch": prefill.batch if prefill else None,
            "decode_step_s": decode.time_s if decode else None,
            "decode_batch": decode.batch if decode else None,
            "fits": r.fits,
        })
        return out
