"""Speed of ``zrt search`` (issue 11's targets).

    python benchmarks/bench_search.py [--groups 3] [--sample 20] [--full]

1. Training: Llama-3-70B on 1,024 H100 at 4M tokens per batch (1,024 × 4,096): the space is
   enumerated (every rule), then every layout of ``--groups`` groups spread over it (a
   group: the layouts sharing tp, cp, ep, micro-batch and precision, whose sharded layer
   graphs are shared) is estimated serially in this process after the captures are
   made, in the search's order — layouts/s on one core (target ≥ 1,000); ``--sample`` of
   them again each from scratch (the rate without reuse). The whole space's time on 2 workers (target < 30 s) is measured with
   ``--full`` and otherwise extrapolated from the one-core rate (printed as such).
2. Serving: Llama-3-70B on 8 H100 with TTFT/TPOT targets, the whole search in this process
   with the capture warm (target < 10 s).
3. Memory: the peak resident size after enumerating at least 100,000 training layouts and
   holding a result row for each (a row is what every estimate keeps; target < 1 GiB).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

from _bench import result

TRAIN_RATE_TARGET = 1000.0
TRAIN_SPACE_TARGET_S = 30.0
SERVE_TARGET_S = 10.0
MEMORY_TARGET_GIB = 1.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=3,
                    help="layer groups whose layouts are timed with reuse")
    ap.add_argument("--sample", type=int, default=20,
                    help="layouts timed each from scratch (the rate without reuse)")
    ap.add_argument("--full", action="store_true",
                    help="search the whole training space on 2 workers")
    args = ap.parse_args(argv)

    from zrt_core.capture.sources import raw_config
    from zrt_core.modelinfo import ModelDims
    from zrt_core.plugins import get_plugin_manager
    from zrt_core.search import ServeSpace, TrainSpace, search
    from zrt_core.search.evaluate import TrainEvaluator, layer_group
    from zrt_core.search.space import enumerate_train, train_space_size

    host = get_plugin_manager()
    config, _ = raw_config("llama3-70b", host)
    dims = ModelDims.from_config(config)
    space = TrainSpace(gpus=(1024,), global_batch=1024, seq_len=4096)
    t0 = time.perf_counter()
    cands, removed = enumerate_train(space, dims, 8)
    enum_s = time.perf_counter() - t0
    print(f"training space: {train_space_size(space, dims):,} enumerated in {enum_s:.3f} s, "
          f"{len(cands):,} valid; removed {dict(removed)}", flush=True)
    ev = TrainEvaluator("llama3-70b", "h100", space.global_batch, space.seq_len, host=host)
    t0 = time.perf_counter()
    for key in sorted({(c.micro_batch, c.precision) for c in cands}):
        ev.capture(*key)
    print(f"captures (micro-batch 1, 2, 4): {time.perf_counter() - t0:.1f} s", flush=True)
    # every layout of every k-th group of layouts sharing tp, cp, ep, micro-batch and
    # precision (the sharded layer graphs), in the order a search visits them: the shared
    # per-layer work counts as often per layout as in the whole search
    by_group: dict[tuple, list] = {}
    for c in cands:
        by_group.setdefault(layer_group(c)[:-1], []).append(c)
    keys = sorted(by_group)
    pick = keys[::max(1, len(keys) // args.groups)][:args.groups]
    sample = [c for k in pick for c in by_group[k]]
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    for c in sample:
        ev.row(c)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    rate = len(sample) / cpu
    print(f"{len(sample)} layouts of {len(pick)} of {len(keys)} groups in {wall:.2f} s "
          f"wall, {cpu:.2f} s CPU ({cpu / len(sample) * 1e3:.1f} ms CPU each)", flush=True)
    # the same estimates each from scratch (no shared per-layer work), on a slice
    TrainEvaluator.reuse_layers = False
    alone = sample[::max(1, len(sample) // args.sample)][:args.sample]
    cpu0 = time.process_time()
    for c in alone:
        ev.row(c)
    alone_rate = len(alone) / (time.process_time() - cpu0)
    TrainEvaluator.reuse_layers = True
    print(f"each layout alone (no reuse): {alone_rate:.1f} layouts per CPU-second "
          f"({len(alone)} layouts); with reuse {rate / alone_rate:.1f}x", flush=True)
    result("training layouts per CPU-second (one core)", rate, TRAIN_RATE_TARGET, "layouts/s",
           higher_is_better=True)
    if args.full:
        t0 = time.perf_counter()
        full = search("llama3-70b", "h100", space, workers=2, host=host, full_report=False)
        whole = time.perf_counter() - t0
        print(f"whole space: {full.evaluated:,} estimated; best "
              f"{full.winner and full.winner['tokens_per_s_per_gpu']:.0f} tokens/s/GPU",
              flush=True)
        result("whole training space, 2 workers", whole, TRAIN_SPACE_TARGET_S, "s")
    else:
        result("whole training space, 2 cores (extrapolated from the one-core rate)",
               len(cands) / rate / 2, TRAIN_SPACE_TARGET_S, "s")

    serve = ServeSpace(gpus=(8,), input_len=1024, output_len=256)
    search("llama3-70b", "h100", ServeSpace(gpus=(8,), input_len=1024, output_len=256, tp=(8,),
                                            quant=("none",), batch=(1,)), host=host)  # capture
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    served = search("llama3-70b", "h100", serve, ttft_ms=2000, tpot_ms=50, host=host)
    serve_s = time.perf_counter() - t0
    print(f"serving: {served.evaluated} layouts estimated in {serve_s:.2f} s wall, "
          f"{time.process_time() - cpu0:.2f} s CPU", flush=True)
    result("serving search, Llama-3-70B on 8 H100 with targets (capture warm)", serve_s,
           SERVE_TARGET_S, "s")

    big = TrainSpace(gpus=(256, 512, 1024, 2048), global_batch=4096, seq_len=4096,
                     micro_batch=(1, 2, 4, 8), precision=("bf16", "fp8"))
    many, _ = enumerate_train(big, dims, 8)
    row = ev.row(cands[0])
    rows = [dict(row, tp=c.parallel.tp, pp=c.parallel.pp, dp=c.parallel.dp) for c in many]
    while len(rows) < 100_000:
        rows.extend(dict(r) for r in rows[:100_000 - len(rows)])
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2 ** 30
    print(f"{len(rows):,} rows held ({len(many):,} distinct layouts)", flush=True)
    result("peak resident memory with 100,000 layouts' rows", peak_gib, MEMORY_TARGET_GIB,
           "GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
