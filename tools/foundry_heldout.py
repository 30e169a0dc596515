"""Write ``benchmarks/data/foundry_heldout.yaml``: MosaicML llm-foundry's published MPT
training benchmarks, as validation records.

    python tools/foundry_heldout.py OUT_YAML [--mirror DIR]

The tables are ``scripts/train/benchmarking/README.md`` of mosaicml/llm-foundry, read from the
bare mirror ``DIR/mosaicml+llm-foundry/repo`` (``fetch`` writes it; ``--mirror`` overrides
``DIR``) at :data:`COMMIT`. They were added in 2023-10 ("Update_pretrain_benchmarks", #543:
H100 80GB BF16 and FP8, A100 80GB) and 2024-01 ("new benchmarks", #838: H100 BF16 on 128-512
GPUs). PyTorch FSDP (Composer) without tensor or pipeline parallelism, one row per run:

- ``Sharding Strategy`` FULL_SHARD is read as FSDP (ZeRO-3), SHARD_GRAD_OP as ZeRO-2;
- ``Activation Checkpointing`` True as full recompute, False as none; rows with activation
  CPU offload are left out (zrt does not model it);
- ``Precision`` amp_bf16 / bf16 (``MP Mode`` PURE) as bf16, amp_fp8 as fp8 (TransformerEngine
  linear layers);
- ``GPU`` h100_80gb as ``nvidia_h100_sxm``, a100_80gb as ``nvidia_a100_sxm_80g`` (the page:
  "A100 80GB with 1600 Gbps node-node interconnect (RoCE)"); the A100 40GB table has no
  hardware id and is left out;
- the model is llm-foundry's MPT yaml of that size (``scripts/train/yamls/pretrain/
  mpt-*.yaml``: d_model, n_heads, n_layers, expansion ratio 4, vocabulary 50368, no biases)
  as transformers' ``mpt`` config; ``NumParams`` agrees with it;
- ``measured.tokens_per_s_per_gpu`` is published (``Throughput (T/s/GPU)``); ``step_time_s``
  is derived as global batch · sequence / (tokens/s/GPU · GPUs).

The runs' software (what ``submit_benchmarks.py`` installed) decides their attention kernels:
llm-foundry v0.3.0 ``.[gpu]`` = flash-attn 1.0.9 for the 2023-10 tables, ``.[gpu-flash2]`` =
flash-attn 2.4.2 for the 2024-01 one; zrt reads an llm-foundry source as FlashAttention 1.x
(``zrt_core.estimate.training.spec.ATTENTION_BY_SOURCE``), so the 2024-01 rows are priced
with the older kernel. Nothing in zrt is fitted on these records
(``benchmarks/bench_heldout_foundry.py``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
MIRROR = ROOT.parent / ".mirror"
REPO = "mosaicml+llm-foundry"
#: the README as of llm-foundry 8c8dd48f7 (its tables unchanged since 2024-01, 5e85bd62d)
COMMIT = "8c8dd48f7"
README = "scripts/train/benchmarking/README.md"
#: model size -> (d_model, n_heads, n_layers), llm-foundry's scripts/train/yamls/pretrain
MPT = {"125m": (768, 12, 12), "350m": (1024, 16, 24), "760m": (1536, 12, 24),
       "1b": (2048, 16, 24), "3b": (2560, 20, 32), "7b": (4096, 32, 32),
       "13b": (5120, 40, 40), "30b": (7168, 56, 48), "70b": (8192, 64, 80)}
HARDWARE = {"h100_80gb": "nvidia_h100_sxm", "a100_80gb": "nvidia_a100_sxm_80g"}
PRECISION = {"amp_bf16": "bf16", "bf16": "bf16", "amp_fp8": "fp8"}


def records(text: str) -> list[dict[str, Any]]:
    """One record per table row zrt can price (module docstring)."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    section = ""
    for line in text.splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 20 or cells[0] in ("Model", "---"):
            continue
        (model, seq, gpus, gpu, _mfu, _hfu, _tflop, mbs, accum, gbs, _sps, _tps, tps_gpu,
         _gbs_tokens, precision, mp_mode, shard, ac, offload, params) = cells[:20]
        if gpu not in HARDWARE or model not in MPT or precision not in PRECISION \
                or offload == "True":
            continue
        seq_len, n, micro, global_batch = int(seq), int(gpus), int(mbs), int(gbs)
        d_model, heads, layers = MPT[model]
        rid = (f"heldout-foundry-{gpu.split('_')[0]}-{PRECISION[precision]}-mpt-{model}"
               f"-s{seq_len}-{n}gpu-mb{micro}-{'ac' if ac == 'True' else 'noac'}"
               f"-{shard.lower().replace('_', '')}")
        if rid in seen:
            continue
        seen.add(rid)
        full = shard == "FULL_SHARD"
        tokens = float(tps_gpu)
        out.append({
            "id": rid,
            "source": f"MosaicML llm-foundry MPT training benchmarks "
                      f"(mosaicml/llm-foundry@{COMMIT} {README}), {section}",
            "trust": "high", "workload": "train",
            "model": {"name": f"MPT {model}", "hf_config": {
                "model_type": "mpt", "d_model": d_model, "n_heads": heads,
                "n_layers": layers, "expansion_ratio": 4, "max_seq_len": seq_len,
                "vocab_size": 50368, "no_bias": True}},
            "hardware": HARDWARE[gpu], "num_gpus": n,
            "parallel": {"tp": 1, "pp": 1, "vp": 1, "cp": 1, "ep": 1, "etp": None, "dp": n,
                         "sp": False, "zero": 3 if full else 2, "fsdp": full},
            "recompute": "full" if ac == "True" else "none",
            "micro_batch": micro, "global_batch": global_batch, "seq_len": seq_len,
            "precision": PRECISION[precision],
            "measured": {"tokens_per_s_per_gpu": tokens,
                         "step_time_s": round(global_batch * seq_len / (tokens * n), 6)},
            "notes": f"Composer FSDP {shard}, mixed precision {mp_mode}, precision "
                     f"{precision}; gradient accumulation {accum}; NumParams {params}. "
                     "step_time_s derived = GBS*seq/(tok/s/GPU*GPUs).",
        })
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--mirror", type=Path, default=MIRROR)
    args = ap.parse_args(argv)
    git_dir = args.mirror / REPO / "repo"
    text = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{COMMIT}:{README}"],
                          check=True, capture_output=True, text=True).stdout
    rows = records(text)
    header = ("# Written by tools/foundry_heldout.py: MosaicML llm-foundry's published MPT\n"
              "# training benchmarks (FSDP, 8-512 GPUs), held out: nothing in zrt is fitted "
              "on them.\n")
    args.out.write_text(header + yaml.safe_dump(rows, sort_keys=False, width=100))
    print(f"wrote {len(rows)} records to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
