"""Write ``benchmarks/data/torchtitan_heldout.yaml``: the measured runs torchtitan's
``benchmarks/`` folder publishes, as validation records.

    python tools/torchtitan_heldout.py OUT_YAML

Three files of pytorch/torchtitan (read at ``b5bcd76c6``), every row whose settings the
record format can say:

- ``benchmarks/llama3_h100_202412_torchtitan.md`` (the torchtitan team, 2024-12; torch
  ``1963fc8``, torchao ``eab345c``, torchtitan ``9dec370``): Tables 1-6, Llama 3.1 8B / 70B /
  405B on 8-512 H100, FSDP, CP, TP, PP.
- ``benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md`` (2025-06; torch ``38410cf9``):
  Llama 3.1 70B on 256 H100 (FSDP 32, TP 8) and 8B on 64 H100 (FSDP 8, TP 8), vanilla and
  async TP. The float8 *rowwise* rows are left out: the record format's ``fp8`` cannot say
  rowwise scaling, and the page itself marks their vanilla-TP baseline as a known performance
  bug (pytorch/torchtitan#1207).
- ``benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md`` (Trainy on WhiteFiber, 2025-06;
  torch 2.8.0a0 NGC 25.05, torchtitan ``e7c0cae``): Llama 3.1 8B on 32 and 64 H200.

What the rows leave out is read from torchtitan's own defaults at the commit each ran:

- ``seq_len`` 8192 and ``selective_ac_option = 'op'`` (``train_configs/llama3_*.toml``),
  written ``recompute: selective`` where the table says selective.
- Pipelines: ``pipeline_parallel_microbatches`` defaults to the pipeline degree
  (``pipelining_utils.build_pipeline_schedule``), so a local batch of B runs B / pp
  micro-batches; with no split points ``generate_split_points`` gives looped schedules two
  stages a rank and puts the remainder layers in the middle stages (405B's 126 layers over 8
  stages: 15, 16 × 6, 15; over 16 stages: 7, 8 × 14, 7), written as first / last stage
  layer counts.
- ``mixed_precision_param`` bf16 (``precision: bf16``); float8 is torchao's ``Float8Linear``
  with dynamic per-tensor ("tensorwise") scaling of input, weight and output gradient
  (``--float8.scaling_type_*`` default ``dynamic`` at 9dec370; the 2025-06 pages say
  "tensorwise"): per-tensor current scaling, zrt's ``fp8_cs``.

Left as the records give them, because the format has no field for them (they are in each
record's notes): torch.compile on or off, async TP, and the Grand Teton hosts' H100s (96 GB
HBM2e at 2.4 TB/s, run at a 500 W power limit) labelled ``nvidia_h100_sxm``, the closest id.
``measured.tokens_per_s_per_gpu`` is published; ``step_time_s`` is derived as GBS · sequence /
(tokens/s/GPU · GPUs). Nothing in zrt is fitted on these records
(``benchmarks/bench_heldout_torchtitan.py``).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "src" / "zrt_core" / "data" / "models" / "bundled.yaml"
REPO = "pytorch/torchtitan@b5bcd76c6"
F2412 = "benchmarks/llama3_h100_202412_torchtitan.md"
F2506 = "benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md"
TRAINY = "benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md"
TEAM_H100 = ("Grand Teton hosts: 8 H100 (96 GB HBM2e, 2.4 TB/s) per host on NVLink, 400 Gb/s "
             "RDMA per GPU, run at the default 500 W power limit (the page); labelled "
             "nvidia_h100_sxm, the closest id.")
MODELS = {"8B": "llama3.1-8b", "70B": "llama3.1-70b", "405B": "llama3.1-405b"}

#: (file, table, model, gpus, fsdp, tp, pp, vp, cp, local batch, seq, recompute, precision,
#:  compile, async TP, variant slug, tokens/s/GPU, memory GiB)
ROWS: tuple[tuple[Any, ...], ...] = (
    (F2412, "Table 1", "8B", 8, 8, 1, 1, 1, 1, 2, 8192, "selective", "bf16", False, False,
     "fsdp", 5762, 82.4),
    (F2412, "Table 1", "8B", 8, 8, 1, 1, 1, 1, 2, 8192, "selective", "bf16", True, False,
     "fsdp-compile", 6667, 77.0),
    (F2412, "Table 1", "8B", 8, 8, 1, 1, 1, 1, 2, 8192, "selective", "fp8_cs", True, False,
     "fsdp-compile-float8", 8532, 76.8),
    (F2412, "Table 2", "8B", 8, 8, 1, 1, 1, 1, 1, 32768, "full", "fp8_cs", True, False,
     "fsdp8-cp1", 3890, 83.9),
    (F2412, "Table 2", "8B", 8, 4, 1, 1, 1, 2, 1, 65536, "full", "fp8_cs", True, False,
     "fsdp4-cp2", 2540, 84.2),
    (F2412, "Table 2", "8B", 8, 2, 1, 1, 1, 4, 1, 131072, "full", "fp8_cs", True, False,
     "fsdp2-cp4", 1071, 84.0),
    (F2412, "Table 2", "8B", 8, 1, 1, 1, 1, 8, 1, 262144, "full", "fp8_cs", True, False,
     "fsdp1-cp8", 548, 84.5),
    (F2412, "Table 3", "8B", 128, 128, 1, 1, 1, 1, 2, 8192, "selective", "bf16", False, False,
     "fsdp", 5605, 67.0),
    (F2412, "Table 3", "8B", 128, 128, 1, 1, 1, 1, 2, 8192, "selective", "bf16", True, False,
     "fsdp-compile", 6514, 62.0),
    (F2412, "Table 3", "8B", 128, 128, 1, 1, 1, 1, 2, 8192, "selective", "fp8_cs", True, False,
     "fsdp-compile-float8", 8380, 61.8),
    (F2412, "Table 4", "70B", 256, 32, 8, 1, 1, 1, 16, 8192, "full", "fp8_cs", True, False,
     "2d", 829, 71.9),
    (F2412, "Table 4", "70B", 256, 32, 8, 1, 1, 1, 16, 8192, "full", "fp8_cs", True, True,
     "2d-asynctp", 876, 67.6),
    (F2412, "Table 5", "405B", 512, 8, 8, 8, 1, 1, 32, 8192, "full", "fp8_cs", True, True,
     "3d-1f1b", 100, 82.5),
    (F2412, "Table 5", "405B", 512, 8, 8, 8, 2, 1, 32, 8192, "full", "fp8_cs", True, True,
     "3d-interleaved", 128, 72.7),
    (F2412, "Table 6", "405B", 512, 8, 8, 8, 1, 1, 8, 32768, "full", "fp8_cs", True, True,
     "4d-fsdp8-cp1", 76, 75.3),
    (F2412, "Table 6", "405B", 512, 4, 8, 8, 1, 2, 8, 65536, "full", "fp8_cs", True, True,
     "4d-fsdp4-cp2", 47, 75.9),
    (F2412, "Table 6", "405B", 512, 2, 8, 8, 1, 4, 8, 131072, "full", "fp8_cs", True, True,
     "4d-fsdp2-cp4", 31, 77.1),
    (F2412, "Table 6", "405B", 512, 1, 8, 8, 1, 8, 8, 262144, "full", "fp8_cs", True, True,
     "4d-fsdp1-cp8", 16, 84.9),
    (F2506, "Llama3 70b on 256 H100s", "70B", 256, 32, 8, 1, 1, 1, 16, 8192, "full", "bf16",
     True, False, "tp-bf16", 597.3, None),
    (F2506, "Llama3 70b on 256 H100s", "70B", 256, 32, 8, 1, 1, 1, 16, 8192, "full", "bf16",
     True, True, "asynctp-bf16", 652.4, None),
    (F2506, "Llama3 70b on 256 H100s", "70B", 256, 32, 8, 1, 1, 1, 16, 8192, "full", "fp8_cs",
     True, False, "tp-float8", 809.8, None),
    (F2506, "Llama3 70b on 256 H100s", "70B", 256, 32, 8, 1, 1, 1, 16, 8192, "full", "fp8_cs",
     True, True, "asynctp-float8", 942.4, None),
    (F2506, "Llama3 8b on 64 H100s", "8B", 64, 8, 8, 1, 1, 1, 12, 8192, "selective", "bf16",
     True, False, "tp-bf16", 4378, None),
    (F2506, "Llama3 8b on 64 H100s", "8B", 64, 8, 8, 1, 1, 1, 12, 8192, "selective", "bf16",
     True, True, "asynctp-bf16", 4809.4, None),
    (F2506, "Llama3 8b on 64 H100s", "8B", 64, 8, 8, 1, 1, 1, 12, 8192, "selective", "fp8_cs",
     True, False, "tp-float8", 5078.1, None),
    (F2506, "Llama3 8b on 64 H100s", "8B", 64, 8, 8, 1, 1, 1, 12, 8192, "selective", "fp8_cs",
     True, True, "asynctp-float8", 5570.1, None),
    (TRAINY, "Results", "8B", 32, 32, 1, 1, 1, 1, 2, 8192, "selective", "fp8_cs", True, False,
     "h200-4node", 10938, 47.96),
    (TRAINY, "Results", "8B", 64, 64, 1, 1, 1, 1, 2, 8192, "selective", "fp8_cs", True, False,
     "h200-8node", 10753, 46.97),
)


def _split(layers: int, stages: int) -> tuple[int, int]:
    """First and last stage layer counts of torchtitan's ``generate_split_points``: the base
    interval to the first stage, one extra layer to each middle stage while the remainder
    lasts, the rest to the last."""
    base, extra = divmod(layers, stages)
    placed = base + sum(base + (1 if i <= extra else 0) for i in range(1, stages - 1))
    return base, layers - placed


def record(row: tuple[Any, ...], configs: dict[str, Any]) -> dict[str, Any]:
    (path, table, size, gpus, fsdp, tp, pp, vp, cp, local, seq, recompute, precision,
     compiled, async_tp, variant, tps, memory) = row
    dp = gpus // (tp * pp * cp)
    if dp != fsdp:
        raise SystemExit(f"{table} {variant}: dp {dp} != FSDP {fsdp}")
    model = configs[MODELS[size]]
    gbs = local * dp
    mbs = local // pp if pp > 1 else local
    h200 = path == TRAINY
    notes = [f"{table}: local batch {local}, global batch {gbs}, sequence {seq}."]
    parallel: dict[str, Any] = {"tp": tp, "pp": pp, "vp": vp, "cp": cp, "ep": 1, "etp": None,
                                "dp": dp, "sp": tp > 1 or None, "zero": 3, "fsdp": True}
    config = copy.deepcopy(model["hf_config"])
    if seq > config["max_position_embeddings"]:
        config["max_position_embeddings"] = seq
        notes.append(f"max_position_embeddings {seq}: torchtitan builds its RoPE table for the "
                     "job's sequence (train.py: model_config.max_seq_len = training.seq_len).")
    if pp > 1:
        layers = config["num_hidden_layers"]
        first, last = _split(layers, pp * vp)
        middle = (layers - first - last) // (pp * vp - 2)
        if vp == 1:
            parallel["decoder_first_pipeline_num_layers"] = first
            parallel["decoder_last_pipeline_num_layers"] = last
        else:  # Megatron's first/last counts are per pipeline rank: the layout says stages
            parallel["pipeline_model_parallel_layout"] = (
                f"E{'t' * first}|({'t' * middle}|)*{pp * vp - 2}{'t' * last}L")
        notes.append(f"Pipeline: {pp} micro-batches of {mbs} (pipeline_parallel_microbatches "
                     f"defaults to the pipeline degree); {pp * vp} stages of {first}, "
                     f"{middle} x {pp * vp - 2}, {last} layers (generate_split_points).")
    notes.append(f"torch.compile {'on' if compiled else 'off'}; async TP "
                 f"{'on' if async_tp else 'off'}; activation checkpointing {recompute}"
                 f"{' (selective_ac_option op)' if recompute == 'selective' else ''}; "
                 f"{'float8 tensorwise (dynamic)' if precision == 'fp8_cs' else 'bf16'}.")
    if memory is not None:
        notes.append(f"Memory published: {memory} GiB (max over GPUs).")
    notes.append("Trainy's WhiteFiber hosts: 8 H200 on NVLink, 400 Gb/s CX-7 per GPU; float8 "
                 "with FSDP float8 all-gather." if h200 else TEAM_H100)
    notes.append("Measured: tokens_per_s_per_gpu published; step_time_s derived = "
                 "GBS*seq/(tok/s/GPU*GPUs).")
    tag = {F2412: "2412", F2506: "2506-asynctp", TRAINY: "2506-trainy"}[path]
    return {
        "id": f"heldout-torchtitan-{tag}-llama3.1-{size.lower()}-{gpus}gpu-"
              f"{'t' + table.split()[-1] + '-' if path == F2412 else ''}{variant}",
        "source": f"torchtitan benchmarks ({REPO} {path}), {table}",
        "trust": "high", "workload": "train",
        "model": {"name": model["name"], "hf_config": config},
        "hardware": "nvidia_h200" if h200 else "nvidia_h100_sxm", "num_gpus": gpus,
        "parallel": parallel, "recompute": recompute, "micro_batch": mbs,
        "global_batch": gbs, "seq_len": seq, "precision": precision,
        "measured": {"step_time_s": round(gbs * seq / (tps * gpus), 4),
                     "tokens_per_s_per_gpu": float(tps)},
        "notes": " ".join(notes),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    configs = {m["key"]: m for m in yaml.safe_load(BUNDLED.read_text())}
    records = [record(row, configs) for row in ROWS]
    ids = [r["id"] for r in records]
    dupes = {i for i in ids if ids.count(i) > 1}
    if dupes:
        raise SystemExit(f"duplicate ids: {sorted(dupes)}")
    header = ("# Written by tools/torchtitan_heldout.py: torchtitan's published benchmarks\n"
              "# (benchmarks/*.md), held out: nothing in zrt is fitted on them.\n")
    args.out.write_text(header + yaml.safe_dump(records, sort_keys=False, width=100))
    print(f"wrote {len(records)} records to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
