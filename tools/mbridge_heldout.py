"""Write ``benchmarks/data/mbridge_heldout.yaml``: the rows of Megatron-Bridge's performance summary
that ``../shared/validation/public.yaml`` does not carry, as validation records.

    python tools/mbridge_heldout.py MBRIDGE_GIT_DIR PUBLIC_YAML OUT_YAML

MBRIDGE_GIT_DIR is a Megatron-Bridge git directory (``fetch github:NVIDIA-NeMo/Megatron-Bridge``)
at commit ``067f987d``, the commit the public records name; the summary is read from its
``docs/performance-summary.md`` and ``docs/performance-summary-archive.md``. Each table row becomes
one record, read as the public file's Megatron-Bridge records are (their ``notes`` say how): dp =
GPUs / (tp · pp · cp), step time = GBS · sequence / (tokens/s/GPU · GPUs), a parenthesised
alternate a second record (``-alt``). Rows the public file has (same release, model, system, GPU
count, batches and tokens/s) are left out, and so are models whose config the public file lacks
(Nemotron 3 Ultra); Kimi K2's is zrt's bundled copy
under its checkpoint's ``model_type`` (``kimi_k2``, which the zrt_deepseek plugin builds). Model configs are the public file's. Nothing in
zrt is fitted on these records (``benchmarks/bench_heldout_training.py``).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

COMMIT = "067f987df"
FILES = ("docs/performance-summary.md", "docs/performance-summary-archive.md")
SYSTEMS = {"DGX-GB300": ("nvidia_gb300_nvl72", "gb300"), "DGX-GB200": ("nvidia_gb200_nvl72", "gb200"),
           "DGX-B300": ("nvidia_b300", "b300"), "DGX-B200": ("nvidia_b200", "b200"),
           "DGX-H100": ("nvidia_h100_sxm", "h100")}
PRECISION = {"bf16": "bf16", "fp8": "fp8", "fp8-cs": "fp8", "fp8-mx": "mxfp8", "mxfp8": "mxfp8",
             "nvfp4": "nvfp4"}
#: summary model name (lower case, no variant) -> (the public file's model name, the id's slug)
MODELS = {"llama3_8b": ("Llama 3 8B", "llama3-8B"), "llama3_70b": ("Llama 3 70B", "llama3-70B"),
          "llama3.1_405b": ("Llama 3.1 405B", "llama3.1-405B"),
          "deepseekv3": ("DeepSeek-V3 671B (37B active)", "deepseek-v3"),
          "deepseekv4 flash": ("DeepSeek-V4-Flash (~284B total, ~13B active)", "deepseek-v4-flash"),
          "gpt oss 120b": ("GPT-OSS 120B (117B total, 5.1B active)", "gpt-oss-120b"),
          "qwen3_30b_a3b": ("Qwen3-30B-A3B", "qwen3-30b-a3b"),
          "qwen3_235b_a22b": ("Qwen3-235B-A22B", "qwen3-235b-a22b"),
          "nemotron_3_nano": ("Nemotron 3 Nano 30B-A3B", "nemotron3-nano"),
          "nemotron_3_super": ("Nemotron 3 Super 120B-A12B", "nemotron3-super"),
          "nemotron_3_5_lightning": ("Nemotron 3.5 Lightning 30B-A3B", "nemotron3.5-lightning"),
          "kimi_k2": ("Kimi K2 1T (32B active)", "kimi-k2")}
#: models the public file has no config for: zrt's bundled copy (src/zrt_core/data/models/
#: bundled.yaml), under the checkpoint's own model_type
BUNDLED = {"Kimi K2 1T (32B active)": ("kimi-k2", "kimi_k2")}
KINDS = {"Pre-Training Performance": "pre-training", "SFT Performance": "sft",
         "LoRA Performance": "lora"}
MOE_NOTE = ("Source notes: MoE: token distribution force-balanced across experts; dropless unless "
            "model name says tokendrop (release footnote).")


def _cell(text: str) -> tuple[str, str | None]:
    """A table cell and its parenthesised alternate, footnote marks removed."""
    text = re.sub(r"\[\^[^\]]*\]", "", text).strip()
    found = re.fullmatch(r"(.*?)\s*\((.*)\)", text)
    return (found.group(1).strip(), found.group(2).strip()) if found else (text, None)


def _int(text: str, default: int | None = None) -> int | None:
    return default if text.lower() in ("n/a", "-", "") else int(text)


def rows(text: str, page: str):
    """Yield (release, kind, section heading, fields, alternate fields, footnotes) per table row."""
    release = kind = heading = None
    header: list[str] | None = None
    for line in text.splitlines():
        if m := re.match(r"## (\d\d\.\d\d(?:\.\d\d)?) NeMo Container", line):
            release, kind = m.group(1), None
        elif line.startswith("### "):
            kind = KINDS.get(line[4:].strip())
        elif line.startswith("#### "):
            heading, header = line[5:].strip(), None
        elif line.startswith("|") and release and kind:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header = [c.lower() for c in cells]
            elif not set(cells[0]) <= set("-: "):
                main, alt = {}, {}
                for name, cell in zip(header, cells, strict=True):
                    main[name], alt[name] = _cell(cell)
                yield release, kind, heading, main, alt, page


def records(pages: dict[str, str], public: list[dict[str, Any]]) -> list[dict[str, Any]]:
    configs = {r["model"]["name"]: r["model"]["hf_config"] for r in public}
    bundled = {m["key"]: m["hf_config"] for m in yaml.safe_load(
        (Path(__file__).resolve().parents[1] / "src" / "zrt_core" / "data" / "models"
         / "bundled.yaml").read_text(encoding="utf-8"))}
    for name, (key, model_type) in BUNDLED.items():
        configs[name] = {**bundled[key], "model_type": model_type}
    seen = set()
    for r in public:
        if r["id"].startswith("mbridge-"):
            rel = re.search(r"NeMo (\d\d\.\d\d(?:\.\d\d)?)\b", r["source"]).group(1)
            seen.add((rel, r["model"]["name"], r["hardware"], r["num_gpus"], r["global_batch"],
                      r["micro_batch"], r["precision"],
                      float(r["measured"]["tokens_per_s_per_gpu"])))
    out: list[dict[str, Any]] = []
    ids: set[str] = set()
    for page, text in pages.items():
        for release, kind, heading, main, alt, _ in rows(text, page):
            system = main.get("system") or heading.removeprefix("System: ")
            model_cell = main.get("model") or heading.removeprefix("Model: ")
            variant = re.search(r"\(([^)]*)\)", model_cell)
            base = re.sub(r"\s*\(.*", "", model_cell).strip().lower()
            if base not in MODELS or system not in SYSTEMS:
                continue
            for which in ("main", "alt"):
                vals = dict(main)
                if which == "alt":
                    alts = {k: v for k, v in alt.items() if v is not None}
                    tok_alt = next((v for k, v in alts.items() if k.startswith("tokens")), None)
                    if tok_alt is None:
                        continue
                    vals.update(alts)
                rec = _record(release, kind, heading, page, system, base, variant, vals,
                              which == "alt", configs)
                if rec is None:
                    continue
                key = (release, rec["model"]["name"], rec["hardware"], rec["num_gpus"],
                       rec["global_batch"], rec["micro_batch"], rec["precision"],
                       rec["measured"]["tokens_per_s_per_gpu"])
                if key in seen:
                    continue
                seen.add(key)
                while rec["id"] in ids:
                    rec["id"] += f"-mbs{rec['micro_batch']}"
                ids.add(rec["id"])
                out.append(rec)
    return out


def _record(release, kind, heading, page, system, base, variant, vals, is_alt, configs):
    model_cell = f"{MODELS[base][0]} ({variant.group(1)})" if variant else ""
    name, slug = MODELS[base]
    if name not in configs:
        return None
    hardware, gpu = SYSTEMS[system]
    label = vals.get("precision")
    if label is None:  # 25.09: no precision column; FP8 (current scaling), MXFP8 alternate
        label = "fp8-mx" if is_alt and gpu != "h100" else "fp8"
        if is_alt and gpu == "h100":
            return None  # H100's alternate is FP8 block scaling, which zrt does not price apart
    precision = PRECISION.get(label.lower())
    if precision is None:
        return None
    gpus = int(vals["#-gpus"])
    tp, pp, cp = _int(vals["tp"], 1), _int(vals["pp"], 1), _int(vals["cp"], 1)
    vp = _int(vals["vp"], 1 if pp == 1 else None)
    ep = _int(vals["ep"], 1)
    gbs, mbs, seq = int(vals["gbs"]), int(vals["mbs"]), int(vals["sequence length"])
    tok = float(next(v for k, v in vals.items() if k.startswith("tokens")))
    tflop = next((v for k, v in vals.items() if k.startswith("model tflop")), None)
    config = dict(configs[name])
    notes = [f"Parallel: dp={gpus // (tp * pp * cp)} derived as num_gpus/(tp*pp*cp) (not printed)."]
    fsdp_cell = vals.get("fsdp")
    fsdp = zero = None
    if fsdp_cell is not None:
        fsdp = _int(fsdp_cell, 0) > 0
        zero = 3 if fsdp else 1
        if fsdp:
            notes.append(f"Megatron-FSDP (optim+grads+params sharded) with sharding-group size "
                         f"{fsdp_cell} as printed in the FSDP column.")
    notes.append("Measured: tokens_per_s_per_gpu published; step_time_s derived = "
                 "GBS*seq/(tok/s/GPU*GPUs).")
    extra = f"Also published: model TFLOP/s/GPU {tflop}" if tflop else ""
    if vals.get("ga"):
        extra += f"; GA {vals['ga']}"
    if extra:
        notes.append(extra + ".")
    if kind == "sft":
        notes.insert(0, "WORKLOAD: full-parameter SFT on packed sequences (same compute "
                     "structure as pre-training).")
    if kind == "lora":
        notes.insert(0, "WORKLOAD: LoRA fine-tuning.")
    moe = ep > 1 or "expert" in str(config).lower()
    if moe:
        notes.append(MOE_NOTE)
    var = variant.group(1) if variant else ""
    if "tokendrop" in var.lower():
        notes.append("Token-drop MoE run.")
    if var:
        notes.append(f"Model variant: {model_cell}.")
    if base == "kimi_k2":
        notes.append("Source notes: Muon optimizer was used for pre-training Kimi-K2 (the "
                     "table's note).")
    if "w/o mtp" in var.lower():
        config["num_nextn_predict_layers"] = 0
    elif "w/ mtp" in var.lower():
        config["num_nextn_predict_layers"] = 1
    if is_alt:
        notes.append("Source notes: Alternate (parenthesized) value from the same table cell; "
                     "config columns without parentheses are shared with the primary entry.")
    where = "current page" if page.endswith("performance-summary.md") else page.split("/")[-1]
    prec_id = label.lower() if release in ("25.09", "25.11") else precision
    rid = (f"mbridge-{release}-{kind}-{slug}-{gpu}-{gpus}gpu-{prec_id}-gbs{gbs}"
           + ("-alt" if is_alt else ""))
    step = gbs * seq / (tok * gpus)
    return {
        "id": rid.replace("mbridge-", "heldout-mbridge-", 1),
        "source": (f"NVIDIA Megatron-Bridge performance summary, NeMo {release} ({where}, "
                   f"Megatron-Bridge@{COMMIT[:8]}), {dict((v, k) for k, v in KINDS.items())[kind]} "
                   f"/ {heading}"),
        "trust": "high", "workload": "train",
        "model": {"name": name, "hf_config": config},
        "hardware": hardware, "num_gpus": gpus,
        "parallel": {"tp": tp, "pp": pp, "vp": vp, "cp": cp, "ep": ep,
                     "etp": None if moe else 1, "dp": gpus // (tp * pp * cp), "sp": None,
                     "zero": zero, "fsdp": fsdp},
        "recompute": None, "micro_batch": mbs, "global_batch": gbs, "seq_len": seq,
        "precision": precision,
        "measured": {"step_time_s": round(step, 5 - len(str(int(step)))),
                     "tokens_per_s_per_gpu": tok},
        "notes": " ".join(notes),
    }


def main(argv: list[str]) -> int:
    git_dir, public_path, out_path = argv
    pages = {f: subprocess.run(["git", "--git-dir", git_dir, "show", f"{COMMIT}:{f}"],
                               check=True, capture_output=True, text=True).stdout
             for f in FILES}
    public = yaml.safe_load(Path(public_path).read_text(encoding="utf-8"))
    recs = records(pages, public)
    text = (
        "# Held-out training records: the rows of Megatron-Bridge's performance summary\n"
        f"# (docs/performance-summary.md and performance-summary-archive.md at {COMMIT}) that\n"
        "# ../shared/validation/public.yaml does not carry, read as its Megatron-Bridge records are.\n"
        f"# Built by tools/mbridge_heldout.py ({len(recs)} records). Nothing in zrt is fitted on them\n"
        "# (benchmarks/bench_heldout_training.py).\n")
    Path(out_path).write_text(text + yaml.safe_dump(recs, sort_keys=False, width=100),
                              encoding="utf-8")
    print(f"wrote {len(recs)} records to {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
