"""How much slower is a bf16 GEMM whose vocabulary dimension is not a multiple of 8 elements
(16 bytes)? (docs/profile.md, "GPT-2's output layer"; run on a GPU: ``python
benchmarks/gpu_alignment.py``, about 10 s.)

GPT-2's vocabulary (50,257) is odd; Megatron pads it to a multiple of 128
(``--make-vocab-size-divisible-by``). The output layer's three GEMMs of a training step
(``F.linear`` forward, the input gradient ``dY @ W`` and the weight gradient ``dY^T @ X``)
are timed at GPT-2's size (hidden 768) with rows aligned to 2, 4, 8 and 16 bytes (50,257,
50,258, 50,260, 50,264, 50,272 and the padded 50,304) and at a Llama-size vocabulary made odd
(128,257 against 128,256 at hidden 4096), with CUDA events, the best of 10 after 5 warm-ups.
One JSON line per GEMM: shape, row alignment in bytes, milliseconds, TFLOP/s. (The 2026-11-27
H100 run timed 50,257/50,304 and the Llama pair with this script, and the other GPT-2 sizes
with the same loop inline, in a second call on the same machine: benchmarks/data/.)

``python benchmarks/gpu_alignment.py --fit FILE`` (no GPU) fits the hardware pack's
``matmul_unaligned_8b`` and ``matmul_unaligned_2b`` from such output (``zrt calibrate``'s
``fit_alignment``, which also times these GEMMs itself: docs/profile.md).
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--fit":
        with open(sys.argv[2]) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        from zrt_core.profile.calibrate import fit_alignment

        print(json.dumps(fit_alignment([r for r in rows if "gemm" in r])))
        return
    import torch

    def best_ms(fn, repeats: int = 10) -> float:
        for _ in range(5):
            fn()
        times = []
        for _ in range(repeats):
            start, end = (torch.cuda.Event(enable_timing=True),
                          torch.cuda.Event(enable_timing=True))
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return min(times)

    dt = torch.bfloat16
    for tokens, hidden, vocabs in [(8192, 768, (50257, 50258, 50260, 50264, 50272, 50304)),
                                   (4096, 4096, (128257, 128256))]:
        x = torch.randn(tokens, hidden, device="cuda", dtype=dt)
        for vocab in vocabs:
            w = torch.randn(vocab, hidden, device="cuda", dtype=dt)
            dy = torch.randn(tokens, vocab, device="cuda", dtype=dt)
            flops = 2 * tokens * hidden * vocab
            row_bytes = vocab * 2  # bf16: a row of the vocabulary dimension
            cases = {"forward x@W^T": lambda x=x, w=w: torch.nn.functional.linear(x, w),
                     "input grad dY@W": lambda dy=dy, w=w: dy @ w,
                     "weight grad dY^T@X": lambda dy=dy, x=x: dy.t() @ x}
            for name, fn in cases.items():
                ms = best_ms(fn)
                print(json.dumps({"gemm": name, "tokens": tokens, "hidden": hidden,
                                  "vocab": vocab,
                                  "row_alignment_bytes": min(16, row_bytes & -row_bytes),
                                  "ms": round(ms, 4),
                                  "tflops": round(flops / ms / 1e9, 1)}), flush=True)
            del w, dy, cases
    print(json.dumps({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                      "cublas": torch.backends.cuda.preferred_blas_library().name}))


if __name__ == "__main__":
    main()
