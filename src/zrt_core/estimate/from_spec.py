"""The report of an :class:`~zrt_core.analytic.spec.EstimateSpec` (what ``zrt estimate`` and
the server's estimate jobs print): the spec's front-end, its checks, then the estimator."""

from __future__ import annotations

from typing import Any


def estimate_from_spec(spec: Any, host: Any, hw: Any, *, keep_timelines: bool = False) -> Any:
    """The report of an :class:`~zrt_core.analytic.spec.EstimateSpec`: graphs from its
    front-end, then :func:`~zrt_core.estimate.training.estimate_training` or
    :func:`~zrt_core.estimate.estimate_inference`; the spec's ``fusion_rules`` pack goes
    into ``host`` first (once per host)."""
    from zrt_core.capture.sources import raw_config
    from zrt_core.checks import check_infer_request, check_train_request
    from zrt_core.ir.graph import Phase

    if getattr(spec, "fusion_rules", None):
        from zrt_core.transforms.fusion.user import add_user_pack

        add_user_pack(host, spec.fusion_rules)
    config, where = raw_config(spec.model, host)
    if spec.workload == "train":
        check_train_request(config, spec.parallel, spec.train, num_gpus=spec.num_gpus,
                            where=where)
    else:
        check_infer_request(config, spec.parallel, spec.infer, where=where)
    if spec.workload == "train":
        from zrt_core.estimate.training import capture_dtype, estimate_training

        train = spec.train
        captured = None
        if spec.frontend == "analytic":
            from zrt_core.analytic.builder import analytic_capture

            captured = analytic_capture(spec.model, (Phase.TRAIN_FORWARD,
                                                     Phase.TRAIN_BACKWARD),
                                        batch=train.micro_batch, seq_len=train.seq_len,
                                        dtype=capture_dtype(train.precision), host=host)
        return estimate_training(spec.model, hw, spec.parallel, train, host=host,
                                 captured=captured, num_gpus=spec.num_gpus,
                                 keep_timelines=keep_timelines)
    from zrt_core.estimate import CapturedModel, estimate_inference

    infer = spec.infer
    captured = None
    if spec.frontend == "analytic":
        from zrt_core.analytic.builder import analytic_capture

        captured = CapturedModel.from_capture(analytic_capture(
            spec.model, (Phase.PREFILL, Phase.DECODE), batch=1, seq_len=infer.input_len,
            dtype=infer.dtype, host=host))
    return estimate_inference(spec.model, hw, spec.parallel, infer, host=host,
                              captured=captured, engine=spec.engine)
