"""Write ``benchmarks/data/nemo_heldout.yaml``: the pre-training rows of NVIDIA NeMo's own
performance summaries (before Megatron-Bridge took them over), as validation records.

    python tools/nemo_heldout.py OUT_YAML [--mirror DIR]

Three tables, none of them in ``../shared/validation/public.yaml`` (whose NeMo rows are the
long-sequence page's and DGX-Cloud's):

- **NeMo 24.07, DGX-H100, FP8** (NeMo 1.0): ``docs/source/performance/performance_summary.md``
  at NVIDIA/NeMo ``9c5c5e9709`` ("24.07 perf numbers (#10253)"), read from the bare mirror
  ``DIR/NVIDIA+NeMo/repo`` (``fetch`` writes it; ``--mirror`` overrides ``DIR``). Its
  "Pre-training" table: GPT3 5B/20B/175B, Llama 2 7B/13B/70B, Nemotron 8B/22B/340B,
  Llama 3 8B/70B.
- **NeMo 25.02, DGX-B200, FP8** (NeMo 2.0) and the one DGX-H100 row the stored copy of the
  page shows in full (GPT3-175B on 512 GPUs): docs.nvidia.com/nemo-framework/user-guide/
  latest/performance/performance_summary.html as stored when NeMo 25.02 was current.
- **NeMo 25.04, DGX-GB200, FP8 with per-tensor current scaling**:
  docs.nvidia.com/nemo-framework/user-guide/latest/performance/archive/
  25.04-performance-summary.html.

Each row is read as printed: GPUs, global and micro batch, sequence length, TP, PP, CP, VP, EP
(and FSDP where the table has the column); dp = GPUs / (TP · PP · CP), checked against the
printed gradient-accumulation count (GBS = dp · MBS · GA). Both 25.x pages print the Mixtral
8x22B row's GBS and MBS swapped (GBS 1, MBS 64 at 256 GPUs with GA 16 and dp 4): read as GBS
64, MBS 1, which is the only reading GA agrees with. ``measured.tokens_per_s_per_gpu`` is
published; ``step_time_s`` is derived as GBS · sequence / (tokens/s/GPU · GPUs). Everything the
tables leave out (recompute, ZeRO, dispatcher, CUDA graphs) is left null, as a new user would
give it. Model configs are zrt's bundled ones (``src/zrt_core/data/models/bundled.yaml``).
Nothing in zrt is fitted on these records (``benchmarks/bench_heldout_nemo.py``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
MIRROR = ROOT.parent / ".mirror" / "NVIDIA+NeMo" / "repo"
BUNDLED = ROOT / "src" / "zrt_core" / "data" / "models" / "bundled.yaml"
NEMO_2407 = ("9c5c5e9709", "docs/source/performance/performance_summary.md")
URL_2502 = ("https://docs.nvidia.com/nemo-framework/user-guide/latest/performance/"
            "performance_summary.html")
URL_2504 = ("https://docs.nvidia.com/nemo-framework/user-guide/latest/performance/archive/"
            "25.04-performance-summary.html")

#: table model name -> bundled model key
MODELS = {
    "GPT3-5B": "nemo-gpt3-5b", "GPT3-20B": "nemo-gpt3-20b", "GPT3-175B": "nemo-gpt3-175b",
    "LLAMA2-7B": "llama2-7b", "LLAMA2-13B": "llama2-13b", "LLAMA2-70B": "llama2-70b",
    "Nemotron-8B": "nemotron3-8b", "Nemotron-22B": "nemotron3-22b",
    "Nemotron-15B": "nemotron4-15b", "Nemotron-340B": "nemotron4-340b",
    "LLAMA3-8B": "llama3-8b", "LLAMA3-70B": "llama3-70b", "LLAMA3-405B": "llama3.1-405b",
    "Mixtral-8x7B": "mixtral-8x7b", "Mixtral-8x22B": "mixtral-8x22b",
}

# (model, GPUs, GBS, MBS, seq, FSDP, TP, PP, CP, VP, EP, GA, tokens/s/GPU), as the pages print
# them (FSDP None where the table has no such column).
ROWS_2502_B200 = (
    ("GPT3-175B", 512, 2048, 2, 2048, None, 4, 4, 1, 6, 1, 32, 1600),
    ("LLAMA3-8B", 8, 128, 2, 8192, None, 1, 1, 1, 1, 1, 8, 26006),
    ("LLAMA3-70B", 64, 128, 1, 8192, None, 2, 4, 2, 5, 1, 32, 3062),
    ("LLAMA3-405B", 128, 64, 1, 8192, None, 4, 8, 2, 8, 1, 32, 625),
    ("Nemotron-15B", 64, 256, 2, 4096, None, 1, 1, 1, 1, 1, 2, 14760),
    ("Nemotron-340B", 128, 32, 1, 4096, None, 8, 4, 1, 12, 1, 8, 602),
    ("Mixtral-8x7B", 64, 256, 2, 4096, None, 1, 1, 1, 1, 8, 2, 15457),
    ("Mixtral-8x22B", 256, 1, 64, 65536, None, 2, 4, 8, 14, 8, 16, 2232),
)
ROWS_2502_H100 = (
    ("GPT3-175B", 512, 2048, 2, 2048, None, 4, 8, 1, 6, 1, 64, 866),
)
ROWS_2504_GB200 = (
    ("GPT3-175B", 128, 256, 2, 2048, 0, 4, 4, 1, 12, 1, 16, 1804),
    ("LLAMA3-8B", 8, 128, 2, 8192, 0, 1, 1, 1, 1, 1, 8, 33099),
    ("LLAMA3-70B", 64, 128, 1, 8192, 1, 1, 1, 1, 1, 1, 2, 4035),
    ("LLAMA3-405B", 128, 64, 1, 8192, 0, 4, 8, 2, 8, 1, 32, 665),
    ("Nemotron-15B", 64, 256, 2, 4096, 0, 1, 1, 1, 1, 1, 2, 17809),
    ("Nemotron-340B", 128, 32, 1, 4096, 0, 8, 4, 1, 12, 1, 8, 737),
    ("Mixtral-8x7B", 64, 256, 2, 4096, 0, 1, 1, 1, 1, 8, 2, 19275),
    ("Mixtral-8x22B", 256, 1, 64, 65536, 0, 2, 4, 8, 14, 8, 16, 2731),
)


def rows_2407(mirror: Path) -> list[tuple[Any, ...]]:
    """The 24.07 page's pre-training rows, parsed from the mirror."""
    commit, path = NEMO_2407
    text = subprocess.run(["git", "--git-dir", str(mirror), "show", f"{commit}:{path}"],
                          check=True, capture_output=True, text=True).stdout
    section = text.split("### Pretraining", 1)[1].split("###", 1)[0]
    out = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 11 or cells[0] not in MODELS:
            continue
        # Model, GPUs, GBS, MBS, seq, TP, PP, CP, VP, tokens/s/GPU, TFLOP/s ...
        name, gpus, gbs, mbs, seq, tp, pp, cp, vp, tps = cells[:10]
        dp = int(gpus) // (int(tp) * int(pp) * int(cp))
        ga = int(gbs) // (dp * int(mbs))
        out.append((name, int(gpus), int(gbs), int(mbs), int(seq), None, int(tp), int(pp),
                    int(cp), int(vp), 1, ga, int(tps)))
    return out


def record(row: tuple[Any, ...], *, release: str, system: str, hardware: str, source: str,
           precision_note: str, configs: dict[str, Any]) -> dict[str, Any]:
    name, gpus, gbs, mbs, seq, fsdp, tp, pp, cp, vp, ep, ga, tps = row
    dp = gpus // (tp * pp * cp)
    notes = [f"Parallel: dp={dp} derived as num_gpus/(tp*pp*cp) (not printed)."]
    if dp * mbs * ga != gbs:
        if dp * gbs * ga == mbs:  # the pages' Mixtral 8x22B row: GBS and MBS swapped
            gbs, mbs = mbs, gbs
            notes.append(f"GBS and MBS printed swapped ({mbs} and {gbs}); read as GBS {gbs}, "
                         f"MBS {mbs}, the only reading GA {ga} agrees with.")
        else:
            raise SystemExit(f"{release} {name}: GBS {gbs} != dp {dp} x MBS {mbs} x GA {ga}")
    model = configs[MODELS[name]]
    step = gbs * seq / (tps * gpus)
    notes.append("Measured: tokens_per_s_per_gpu published; step_time_s derived = "
                 "GBS*seq/(tok/s/GPU*GPUs).")
    notes.append(precision_note)
    slug = name.lower()
    return {
        "id": f"heldout-nemo-{release}-{slug}-{system}-{gpus}gpu-gbs{gbs}",
        "source": source, "trust": "high", "workload": "train",
        "model": {"name": model["name"], "hf_config": model["hf_config"]},
        "hardware": hardware, "num_gpus": gpus,
        "parallel": {"tp": tp, "pp": pp, "vp": vp, "cp": cp, "ep": ep, "etp": None,
                     "dp": dp, "sp": None, "zero": None,
                     "fsdp": None if fsdp is None else bool(fsdp)},
        "recompute": None, "micro_batch": mbs, "global_batch": gbs, "seq_len": seq,
        "precision": "fp8",
        "measured": {"step_time_s": round(step, 4), "tokens_per_s_per_gpu": float(tps)},
        "notes": " ".join(notes),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--mirror", type=Path, default=MIRROR)
    args = ap.parse_args(argv)
    configs = {m["key"]: m for m in yaml.safe_load(BUNDLED.read_text())}
    tables = (
        (rows_2407(args.mirror), "24.07", "h100", "nvidia_h100_sxm",
         f"NVIDIA NeMo performance summary, NeMo 24.07 (NVIDIA/NeMo@{NEMO_2407[0]} "
         f"{NEMO_2407[1]}), Pretraining / System: DGX-H100",
         "Precision: FP8 (NeMo 1.0's default delayed scaling; the page says FP8)."),
        (ROWS_2502_B200, "25.02", "b200", "nvidia_b200",
         f"NVIDIA NeMo Framework performance summary, NeMo 25.02 ({URL_2502}), "
         "Pretraining / System: DGX-B200",
         "Precision: FP8 (the page: 'at FP8 precision (using NeMo 2.0)')."),
        (ROWS_2502_H100, "25.02", "h100", "nvidia_h100_sxm",
         f"NVIDIA NeMo Framework performance summary, NeMo 25.02 ({URL_2502}), "
         "Pretraining / System: DGX-H100",
         "Precision: FP8 (the page: 'at FP8 precision (using NeMo 2.0)')."),
        (ROWS_2504_GB200, "25.04", "gb200", "nvidia_gb200_nvl72",
         f"NVIDIA NeMo Framework performance summary, NeMo 25.04 ({URL_2504}), "
         "Pre-Training Performance / System: DGX-GB200",
         "Precision: FP8-CS = per-tensor current scaling (the page)."),
    )
    records = [record(row, release=rel, system=system, hardware=hw, source=source,
                      precision_note=note, configs=configs)
               for rows, rel, system, hw, source, note in tables for row in rows]
    ids = [r["id"] for r in records]
    dupes = {i for i in ids if ids.count(i) > 1}
    if dupes:
        raise SystemExit(f"duplicate ids: {sorted(dupes)}")
    header = ("# Written by tools/nemo_heldout.py: NeMo's own performance summaries (24.07 H100,\n"
              "# 25.02 B200/H100, 25.04 GB200), held out: nothing in zrt is fitted on them.\n")
    args.out.write_text(header + yaml.safe_dump(records, sort_keys=False, width=100))
    print(f"wrote {len(records)} records to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
