"""One training estimate end to end, capture excluded: Llama-3-70B on 256 H100s, Megatron's
interleaved 1F1B (tp 8, pp 4, vp 5, dp 8, sequence parallel, distributed optimizer),
global batch 512 of 8,192 tokens — 64 micro-batches through 20 virtual stages.

    python benchmarks/bench_train.py [--model llama3-70b] [--hw h100] [--repeat 3]

The training capture (forward + backward of one micro-batch) is made first and not timed
against the target. Then the estimate runs ``--repeat`` times in a fresh process state
each time (the transformed-graph cache cleared): transforms, pricing, scheduling every
stage, the pipeline simulation, memory. Target: under 300 ms CPU. A second figure is the
re-estimate with the transformed graphs cached (a calibration or a recipe search).
"""

from __future__ import annotations

import argparse
import statistics
import time

from _bench import result

TARGET_MS = 300.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3-70b")
    ap.add_argument("--hw", default="h100")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)

    import zrt_core.estimate.training as training
    from zrt_core.plugins import get_plugin_manager
    from zrt_core.strategy import Parallel, TrainSpec

    host = get_plugin_manager()
    parallel = Parallel(tp=8, pp=4, vp=5, dp=8, sp=True)
    train = TrainSpec(micro_batch=1, global_batch=512, seq_len=8192, zero=1,
                      pp_schedule="interleaved")
    t0, c0 = time.perf_counter(), time.process_time()
    captured = training.capture_for_training(args.model, train.micro_batch, train.seq_len,
                                             host=host)
    print(f"training capture of {args.model} at {train.seq_len} tokens: "
          f"{time.perf_counter() - t0:.2f} s wall, {time.process_time() - c0:.2f} s CPU")

    def estimate():  # type: ignore[no-untyped-def]
        return training.estimate_training(args.model, args.hw, parallel, train, host=host,
                                          captured=captured)

    cold, warm = [], []
    report = None
    for _ in range(args.repeat):
        training._TRANSFORMED.clear()
        c0 = time.process_time()
        report = estimate()
        cold.append(time.process_time() - c0)
        c0 = time.process_time()
        estimate()
        warm.append(time.process_time() - c0)
    assert report is not None
    parts = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in report.timings_s.items())
    print(f"{parallel.describe()} {train.pp_schedule}, {train.num_microbatches(parallel)} "
          f"micro-batches: step {report.step_time_s:.3f} s, MFU {report.mfu:.1%}; "
          f"estimate {statistics.median(cold) * 1e3:.0f} ms CPU (median of {args.repeat}; "
          f"last: {parts}); re-estimate {statistics.median(warm) * 1e3:.0f} ms CPU")
    result(f"estimate_training {args.model} {parallel.describe()} interleaved, CPU",
           statistics.median(cold) * 1e3, TARGET_MS, "ms")
    result("re-estimate with the transformed graphs cached, CPU",
           statistics.median(warm) * 1e3, TARGET_MS, "ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
