"""Which decoder families zrt predicts end to end, from transformers' own configs.

    python benchmarks/bench_families.py [--only TEXT] [--out FILE.json]

For each model type below, transformers' default config (``AutoConfig.for_model``: for
most families the reference checkpoint's sizes) goes through ``zrt validate`` as two
records: training on 8 H100 (dp 8, micro-batch 1, 1,024 tokens — within every default's
positions and free of head-divisibility rules — bf16) and serving on one H100 (128 in /
128 out, 8 sequences). The measured values are placeholders (1 s,
1,000 tokens/s): the benchmark counts what zrt predicts and lists, per family, the one line
it gives where it cannot — a layout rule, a position limit, model code that fails on fake
tensors, a capture the analytic count disagrees with. Families whose default config
transformers itself cannot build (a field its default leaves None), or that are not in the
installed transformers, are skipped with their reason.

Published runs of families zrt was never shown arrive in the validation set it is scored
on; this is the check that they at least get a number (or one clear line), and where
they do not, which mechanism is missing (docs/validation.md, "Families beyond the public
records").
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

from _bench import result

#: Decoder families with published training or serving runs, or the same mechanisms.
FAMILIES = (
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen3_next",
    "qwen3_5_text", "qwen3_5_moe_text", "qwen3_5_moe", "qwen3_vl_moe", "qwen3_vl", "qwen2_5_vl", "qwen2_vl", "glm4v",
    "glm4v_moe", "llava", "mistral3", "gemma", "gemma2", "gemma3_text", "phi", "phi3",
    "phimoe", "gpt2", "gpt_neox", "gptj", "gpt_bigcode", "starcoder2", "opt", "bloom", "falcon",
    "mpt", "olmo", "olmo2", "olmo3", "olmoe", "granite", "granitemoe", "granitemoeshared", "granitemoehybrid",
    "cohere", "cohere2", "glm", "glm4", "glm4_moe", "deepseek_v2", "deepseek_v3",
    "deepseek_v32", "gpt_oss", "llama4_text", "nemotron", "nemotron_h", "ernie4_5",
    "ernie4_5_moe", "hunyuan_v1_dense", "hunyuan_v1_moe", "minimax", "exaone4",
    "internlm3", "stablelm", "persimmon", "seed_oss", "smollm3", "dots1", "arcee",
    "apertus", "helium", "ministral", "jamba", "bamba", "falcon_h1", "zamba2", "kimi_linear",
    "longcat_flash", "jetmoe", "dbrx", "lfm2", "lfm2_moe", "gpt_neo", "xglm", "codegen",
    "mamba", "mamba2", "falcon_mamba", "recurrent_gemma", "gemma3n_text",
)
_DROP = ("transformers_version", "architectures", "torch_dtype", "dtype", "id2label",
         "label2id")


def _config(model_type: str) -> dict:
    """transformers' default config of ``model_type`` as JSON; ``ValueError`` when
    transformers cannot build a model from it itself (its default leaves a field None)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, logging

    logging.set_verbosity_error()  # default configs' token ids past a small vocabulary
    config = AutoConfig.for_model(model_type)
    try:
        with torch.device("meta"):
            AutoModelForCausalLM.from_config(config)
    except ValueError:
        pass  # no causal-LM class for this config (a multimodal wrapper): zrt says so
    except (TypeError, AttributeError, KeyError, IndexError) as exc:
        raise ValueError(f"transformers cannot build its own default config "
                         f"({type(exc).__name__}: {exc})") from None
    cfg = config.to_dict()
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_") and k not in _DROP}
    cfg["model_type"] = model_type
    return json.loads(json.dumps(cfg, default=str))


def _records(model_type: str, cfg: dict) -> list[dict]:
    base = {"source": f"transformers default config ({model_type})", "trust": "low",
            "model": {"name": model_type, "hf_config": cfg}, "hardware": "nvidia_h100_sxm",
            "notes": "placeholder measurements: the benchmark counts predictions"}
    return [
        {"id": f"train-{model_type}", **base, "workload": "train", "num_gpus": 8,
         "parallel": {"tp": 1, "pp": 1, "dp": 8}, "recompute": None, "micro_batch": 1,
         "global_batch": 8, "seq_len": 1024, "precision": "bf16",
         "measured": {"step_time_s": 1.0}},
        {"id": f"infer-{model_type}", **base, "workload": "infer", "num_gpus": 1,
         "parallel": {"tp": 1}, "input_len": 128, "output_len": 128, "concurrency": 8,
         "precision": "bf16", "measured": {"output_tokens_per_s": 1000.0}},
    ]


def main(argv: list[str] | None = None) -> int:
    import yaml

    from zrt_core.cli.main import main as zrt

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="families whose name contains this")
    ap.add_argument("--out", help="write the per-record outcome as JSON")
    args = ap.parse_args(argv)
    families = [f for f in FAMILIES if not args.only or args.only in f]
    records, skipped = [], {}
    for family in families:
        try:
            records += _records(family, _config(family))
        except (ValueError, KeyError, TypeError) as exc:  # not in this transformers
            skipped[family] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "families.yaml"
        path.write_text(yaml.safe_dump(records, sort_keys=False))
        out = Path(tmp) / "out.json"
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):  # the table: the lines below say it
            zrt(["validate", str(path), "--quiet", "--json", str(out)])
        wall = time.perf_counter() - t0
        done = json.loads(out.read_text())["records"]
    ok = [r["id"] for r in done if r["status"] == "ok"]
    failed = {r["id"]: r.get("message", "") for r in done if r["status"] != "ok"}
    for rid, why in sorted(failed.items()):
        print(f"  {rid}: {why[:200]}")
    for family, why in sorted(skipped.items()):
        print(f"  skipped {family}: {why}")
    by_family = {f: all(f"{w}-{f}" in ok for w in ("train", "infer")) for f in families
                 if f not in skipped}
    print(f"{len(ok)} of {len(done)} records predicted ({wall:.0f} s); families with both "
          f"predicted: {sum(by_family.values())} of {len(by_family)}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"predicted": ok, "failed": failed,
                                              "skipped": skipped}, indent=1))
    result("records of transformers' default configs predicted", len(ok) / max(1, len(done))
           * 100, 100.0, "%", higher_is_better=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
