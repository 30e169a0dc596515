"""Training at 10,000+ GPUs: one 16,384-GPU estimate and a 9-point weak-scaling curve, warm.

    python benchmarks/bench_scaling.py [--model llama3.1-405b] [--curve-model llama3-70b]
        [--hw h100] [--repeat 2]

One estimate: Llama 3.1 405B on 16,384 H100 (tp 8, pp 16, dp 128), FSDP (torchtitan's
default under a pipeline: parameters kept gathered for the step), 32 sequences of 8,192
tokens per data-parallel replica, Megatron's embedding/loss-aware stage split. The curve:
Llama 3 70B with tp 8, pp 8 and the distributed optimizer from 64 to 16,384 GPUs (dp 1 to
256, 9 points), 16 sequences per replica, as ``zrt run --train --gpus 64-16384`` runs it:
every point a full estimate (transforms, pricing, stage schedules, pipeline simulation,
memory). The training captures are made (or read from the cache) first and not timed.
Targets: the one estimate under 1 s wall, the curve under 5 s wall.
"""

from __future__ import annotations

import argparse
import time

from _bench import result

TARGET_ONE_S = 1.0
TARGET_CURVE_S = 5.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3.1-405b")
    ap.add_argument("--curve-model", default="llama3-70b")
    ap.add_argument("--hw", default="h100")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args(argv)

    import zrt_core.estimate.training as training
    from zrt_core.estimate.training.scaling import weak_scaling
    from zrt_core.plugins import get_plugin_manager
    from zrt_core.schedule.stages import StageSplit
    from zrt_core.strategy import Parallel, train_spec_defaults

    host = get_plugin_manager()
    split = StageSplit(embedding_loss=True)
    base = Parallel(tp=8, pp=8, dp=1)
    train = train_spec_defaults(base, micro_batch=1, global_batch=16, seq_len=8192, zero=1)
    t0 = time.perf_counter()
    for model in (args.model, args.curve_model):
        training.capture_for_training(model, 1, 8192, host=host)
    print(f"training captures: {time.perf_counter() - t0:.2f} s (not timed)")

    def estimate(parallel, spec, model=args.model):  # type: ignore[no-untyped-def]
        return training.estimate_training(model, args.hw, parallel, spec, host=host,
                                          stage_split=split)

    def estimate_curve(parallel, spec):  # type: ignore[no-untyped-def]
        return training.estimate_training(args.curve_model, args.hw, parallel, spec,
                                          host=host)

    big = Parallel(tp=8, pp=16, dp=128)
    estimate(big, train_spec_defaults(big, micro_batch=1, global_batch=32 * 128, seq_len=8192,
                                      fsdp=True))  # warm: imports, pricing tables
    one, curve_s = [], []
    curve = None
    gpus = [64 * 2**i for i in range(9)]
    weak_scaling(estimate_curve, base, train, gpus[:1])  # warm
    for _ in range(args.repeat):
        training._TRANSFORMED.clear()
        t0 = time.perf_counter()
        report = estimate(big, train_spec_defaults(big, micro_batch=1, global_batch=32 * 128,
                                                   seq_len=8192, fsdp=True))
        one.append(time.perf_counter() - t0)
        training._TRANSFORMED.clear()
        t0 = time.perf_counter()
        curve, _ = weak_scaling(estimate_curve, base, train, gpus)
        curve_s.append(time.perf_counter() - t0)
    assert curve is not None
    print(f"16,384 GPUs: step {report.step_time_s:.3f} s, MFU {report.mfu * 100:.1f}%")
    for p in curve.points:
        print(f"  {p.gpus:>6,} GPUs  step {p.step_time_s:.3f} s  exposed DP "
              f"{p.exposed_dp_s:.3f} s  hidden DP {p.hidden_dp_s:.3f} s")
    print(f"monotone: {curve.monotone}")
    ok = result("16,384-GPU training estimate, warm", min(one), TARGET_ONE_S, "s")
    ok &= result("9-point weak-scaling curve, warm", min(curve_s), TARGET_CURVE_S, "s")
    return 0 if ok and curve.monotone else 1


if __name__ == "__main__":
    raise SystemExit(main())
