"""Is a GEMM timed back to back slower than the same GEMM inside a model step, and is the
clock why? (docs/profile.md, "Layout or clock"; run on a GPU: ``python
benchmarks/gpu_clock.py``, about 20 s; needs NVML's Python binding, ``nvidia-ml-py``.)

Three of Llama-3.1-8B's training GEMMs (``F.linear`` in bf16, weights cycled through 256 MB
as a model's layers read theirs), 60 calls each, timed with CUDA events three ways:

* ``loop``: after 2 s of back-to-back GEMMs (the steady state of ``zrt profile``'s rows);
* ``idle``: with a 3 ms idle gap before each call;
* ``mixed``: after a 256 MB device copy before each call, as a step interleaves
  memory-bound kernels with its GEMMs.

Each line gives the median time and TFLOP/s, and NVML's SM clock and board power sampled
during the calls.
"""

from __future__ import annotations

import time


def main() -> None:
    import pynvml
    import torch

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)

    def clock() -> int:
        return pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)

    def power_w() -> float:
        return pynvml.nvmlDeviceGetPowerUsage(handle) / 1000

    print("max sm clock", pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
          "MHz, idle", clock(), "MHz")
    filler = torch.empty(256 * 2**20, device="cuda", dtype=torch.uint8)
    sink = torch.empty_like(filler)
    linear = torch.nn.functional.linear
    for m, n, k in [(4096, 4096, 14336), (4096, 28672, 4096), (4096, 128256, 4096)]:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        copies = max(1, min(64, 2**28 // (n * k * 2)))
        weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
                   for _ in range(copies)]
        flops = 2 * m * n * k
        for _ in range(20):
            linear(x, weights[0])
        torch.cuda.synchronize()
        for mode in ("loop", "idle", "mixed", "loop"):
            if mode == "loop":
                until = time.time() + 2.0
                while time.time() < until:
                    for j in range(20):
                        linear(x, weights[j % copies])
                    torch.cuda.synchronize()
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(60)]
            clocks, powers = [], []
            for i, (start, end) in enumerate(events):
                if mode == "idle":
                    torch.cuda.synchronize()
                    time.sleep(0.003)
                elif mode == "mixed":
                    sink.copy_(filler)
                start.record()
                linear(x, weights[i % copies])
                end.record()
                if i % 10 == 5:
                    clocks.append(clock())
                    powers.append(round(power_w()))
            torch.cuda.synchronize()
            times = sorted(a.elapsed_time(b) for a, b in events[10:])
            median = times[len(times) // 2]
            print(f"{m}x{n}x{k} {mode:5s} median {median:.3f} ms = "
                  f"{flops / median / 1e9:.0f} TFLOP/s, best {flops / times[0] / 1e9:.0f}; "
                  f"sm MHz {clocks}; W {powers}", flush=True)


if __name__ == "__main__":
    main()
