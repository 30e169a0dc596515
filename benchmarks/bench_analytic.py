"""How long the analytic front-end takes to build a real-size model's graphs (no capture).

Builds Llama-3-70B's prefill, decode, train forward and train backward graphs at batch 1 ×
4096 from the config numbers alone, as ``zrt estimate --config`` does, and reports the
median of ``--repeat`` builds after one warm-up (imports and registries out of the way).

    python benchmarks/bench_analytic.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from _bench import result

from zrt_core.analytic.builder import analytic_capture
from zrt_core.plugins import get_plugin_manager

LLAMA3_70B = {"model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672,
              "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
              "vocab_size": 128256}
PHASES = ("prefill", "decode", "train_forward", "train_backward")
TARGET_MS = 200.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    host = get_plugin_manager()
    analytic_capture(LLAMA3_70B, phases=PHASES, batch=1, seq_len=4096, host=host)
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        r = analytic_capture(LLAMA3_70B, phases=PHASES, batch=1, seq_len=4096, host=host)
        times.append((time.perf_counter() - start) * 1e3)
    nodes = sum(len(g.nodes) for g in r.graphs.values())
    print(f"  Llama-3-70B, 4 phases, {nodes} nodes: median {statistics.median(times):.1f} ms "
          f"(min {min(times):.1f}, max {max(times):.1f})")
    result("analytic graphs of Llama-3-70B, 4 phases", statistics.median(times), TARGET_MS,
           "ms")


if __name__ == "__main__":
    main()
