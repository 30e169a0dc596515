"""How the training model holds on NVIDIA's MLPerf Training submissions it was not tuned on.

    python benchmarks/bench_heldout_mlperf.py [FILE]

Predicts ``benchmarks/data/mlperf_heldout.yaml`` (NVIDIA's closed MLPerf Training v5.0 and v5.1
submissions of Llama 3.1 405B, Llama 3.1 8B and Llama 2 70B LoRA that
``../shared/validation/public.yaml`` does not carry, on H100, B200, GB200 and GB300; built by
``tools/mlperf_heldout.py`` from the submissions' result logs and launch configs) and prints the
step-time MAPE and bias per benchmark × machine, per machine, per precision, and overall.
Nothing in zrt is fitted on these records: this is a held-out check beside
``benchmarks/bench_heldout_training.py``. Issue 9's training target (10%) is the one it is held
to.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from _bench import held_out_main

DEFAULT = Path(__file__).resolve().parent / "data" / "mlperf_heldout.yaml"


def _keys(result, record) -> tuple[str, str, str]:
    # heldout-mlperf-v<round>-<benchmark>-<system>-<n>gpu
    found = re.match(r"heldout-mlperf-v[\d.]+-(gpt3|llama2-70b-lora|llama31-405b|llama31-8b)-",
                     result.id)
    bench = found.group(1) if found else result.id
    machine = result.hardware.removeprefix("nvidia_")
    return f"{bench} {machine}", machine, str(record.raw.get("precision"))


def main(argv: list[str] | None = None) -> int:
    return held_out_main(
        argv, __doc__, DEFAULT, ("benchmark-machine", "machine", "precision"), _keys,
        "held-out training step-time MAPE (NVIDIA MLPerf Training submissions not in "
        "public.yaml)")


if __name__ == "__main__":
    sys.exit(main())
