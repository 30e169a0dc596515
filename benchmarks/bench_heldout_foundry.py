"""How the training model holds on MosaicML llm-foundry's MPT benchmarks, which it was not
tuned on: PyTorch FSDP runs of 125M-70B models on 8-512 A100 and H100.

    python benchmarks/bench_heldout_foundry.py [FILE]

Predicts ``benchmarks/data/foundry_heldout.yaml`` (built by ``tools/foundry_heldout.py`` from
llm-foundry's ``scripts/train/benchmarking/README.md``) and prints the step-time MAPE and bias
per model × machine, per machine and precision, per sequence length, and overall. Nothing in
zrt is fitted on these records, and ``../shared/validation/public.yaml`` carries none of them
(no FSDP-only stack, no sequence beyond 16k): the held-out check of the attention-kernel
generations (docs/cost-model.md, "Attention kernels") beside ``bench_heldout_training.py``
(Megatron-Bridge), ``bench_heldout_mlperf.py`` and ``bench_heldout_nemo.py``. Issue 9's
training target (10%) is the one it is held to.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from _bench import held_out_main

DEFAULT = Path(__file__).resolve().parent / "data" / "foundry_heldout.yaml"


def _keys(result, record) -> tuple[str, str, str]:
    # heldout-foundry-<gpu>-<precision>-mpt-<size>-s<seq>-<n>gpu-mb<m>-<ac>-<sharding>
    found = re.match(r"heldout-foundry-(h100|a100)-(bf16|fp8)-mpt-(\w+)-s(\d+)-", result.id)
    gpu, precision, size, seq = found.groups() if found else ("?", "?", result.id, "0")
    return f"mpt-{size} {gpu}", f"{gpu} {precision}", f"seq {int(seq):6d}"


def main(argv: list[str] | None = None) -> int:
    return held_out_main(
        argv, __doc__, DEFAULT, ("model-machine", "machine-precision", "sequence"), _keys,
        "held-out training step-time MAPE (MosaicML llm-foundry MPT benchmarks, FSDP)")


if __name__ == "__main__":
    sys.exit(main())
