"""How the training model holds on NeMo's own performance summaries, which it was not tuned on.

    python benchmarks/bench_heldout_nemo.py [FILE]

Predicts ``benchmarks/data/nemo_heldout.yaml`` (the pre-training rows of NVIDIA NeMo's
performance summaries before Megatron-Bridge took them over: 24.07 on DGX-H100, 25.02 on
DGX-B200, 25.04 on DGX-GB200; built by ``tools/nemo_heldout.py``) and prints the step-time MAPE
and bias per model × machine, per machine, per release, and overall. Nothing in zrt is fitted
on these records, and ``../shared/validation/public.yaml`` carries none of them: a third
held-out source beside ``bench_heldout_training.py`` (Megatron-Bridge) and
``bench_heldout_mlperf.py`` (MLPerf). Issue 9's training target (10%) is the one it is held to.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from _bench import held_out_main

DEFAULT = Path(__file__).resolve().parent / "data" / "nemo_heldout.yaml"


def _keys(result, record) -> tuple[str, str, str]:
    # heldout-nemo-<release>-<model>-<machine>-<n>gpu-gbs<g>
    found = re.match(r"heldout-nemo-([\d.]+)-(.+)-(h100|b200|gb200)-\d+gpu-gbs", result.id)
    release, model, machine = found.groups() if found else ("?", result.id, "?")
    return f"{model} {machine}", machine, release


def main(argv: list[str] | None = None) -> int:
    return held_out_main(
        argv, __doc__, DEFAULT, ("model-machine", "machine", "release"), _keys,
        "held-out training step-time MAPE (NeMo performance summary rows, 24.07-25.04)")


if __name__ == "__main__":
    sys.exit(main())
