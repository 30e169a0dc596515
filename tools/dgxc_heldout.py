"""Write ``benchmarks/data/dgxc_heldout.yaml``: the pre-training rows of NVIDIA's DGX Cloud
benchmarking recipes (github.com/NVIDIA/dgxc-benchmarking), every release from v24.11.1 to
v25.08.02, as validation records.

    python tools/dgxc_heldout.py OUT_YAML [--mirror DIR]

**What is read.** The bare mirror ``DIR/NVIDIA+dgxc-benchmarking/repo`` (``fetch`` writes it;
``--mirror`` overrides ``DIR``), every tag from v24.11.1 to v25.08.02 in version order, and in
each the per-workload READMEs of the NeMo/Megatron pre-training recipes: ``llama3.1/README_8b.md``,
``README_70b.md``, ``README_405b.md`` (to v25.03) and ``llama3.1/README.md`` (from v25.04),
``nemo_megatron/README_175b.md`` (GPT3 175B, to v25.04.02), ``nemotron/README_15b.md``,
``README_340b.md`` (to v25.03) and ``nemotron/README.md``, ``grok1/README_314b.md`` (to
v25.04.02) and ``grok1/README.md``, ``llama4/README.md`` and ``llama4/pretrain/README.md``,
``deepseek_v3/pretraining/README.md`` and ``deepseek_v3/pretrain/README.md``,
``nemotronh/README.md`` and ``nemotron-h/README.md``. JAX recipes (``paxml``, ``maxtext``),
inference (``inf_*``, ``*/inference``), fine-tuning (``ft_*``, ``*/finetune*``) and the
HuggingFace recipes (``hf-*``) are not read.

**Formats.** Every README has "performance" tables whose header row is ``| <model> <BF16|FP8>
... | <N>x <H100|GB200|B200> GPUs [(GBS=<g>)] | ...`` and whose rows are "Training step time
(seconds per step)", "Throughput in tokens per second", MFU and days-to-1T (from v25.04 some rows
are printed without a leading ``|``; they are read all the same). The layout of a column comes
from, in this order: (1) the header's parenthesis, ``(TP=4, PP=4, CP=2, VP=5, MBS=1, GA=64)``
and ``SEQ=`` (v24.11.1-v25.03 Llama 3.1, GPT3, Nemotron-4); (2) per-column rows ``Layers``,
``GBS``, ``PP``, ``VP`` (v24.11.1-v25.03 Llama 3.1 405B); (3) otherwise a configuration table
``| [Size | Precision |] GPUs | SeqLen | Layers | [FSDP |] TP | PP | CP | EP | [ETP |] DP | VP |
MBS | GBS | GA |`` (Grok-1 from v24.11.1, the others from v25.04), matched by machine (the
nearest ``**GB200**`` / ``## B200`` / ``# H100 ...`` heading above the table; H100 where the
README names none), size, precision, GPU count and, where the column prints one, GBS (Nemotron-4
340B on GB200 at v25.05 has a weak- and a strong-scaling table at the same GPU counts). The
sequence length is the configuration table's ``SeqLen``, the header's ``SEQ=``, or else the
README's model-FLOPs note ``sequence length = N`` (8192 Llama 3.1, 2048 GPT3, 4096 Nemotron-4);
a README that states none would be left out (none is). ``step_time_s`` is published;
``tokens_per_s_per_gpu`` is derived as GBS · seq / (step · GPUs), and each row's GBS · seq is
checked against step · the printed tokens/s (within 3 %). dp = GPUs / (TP · PP · CP) is derived
(Grok-1's v24.11.1-v25.04 tables print DP as dp/EP, later ones print dp); the printed GA is
checked against GBS = dp · MBS · GA and a mismatch is noted, not corrected (v25.05.01-v25.05.04
Llama 3.1 405B H100 prints GA 32 where dp 4 and GBS 256 make it 64; v25.05.05 prints 64). VP
printed NA, or with PP 1, is read as 1; EP and ETP printed NA as 1; FSDP 1 as ``fsdp: true``,
0 as null. Recompute, ZeRO, sequence parallelism and FP8 recipe are not printed and are left
null ("fp8": NeMo 24.x/25.x recipes' FP8 is delayed scaling; no table in these releases says
current scaling or MXFP8). Model configs are zrt's bundled ones
(``src/zrt_core/data/models/bundled.yaml``): llama3.1-8b/-70b/-405b, nemo-gpt3-175b,
nemotron4-15b/-340b, llama4-maverick, deepseek-v3, nemotron-h-56b; Grok-1 is the ``grok-1``
entry of the zrt_xai plugin's models file (``plugins/zrt_xai/src/zrt_xai/models.yaml``; its
model type ``grok-1`` is the plugin's).

**Readings corrected, each noted in the record.** GPT3 175B v25.02-v25.03 prints VP=12 in
its header, but the recipe's ``gpt3_175b_hydra.yaml`` at those tags sets
``virtual_pipeline_model_parallel_size: 6`` and v25.04 republishes the same step times with VP
6: read as VP 6 (v24.11.1-v25.01.1's hydra file sets 12, as their header says). Nemotron-4
340B v25.04-v25.04.02 prints VP NA (with PP 8), but ``nemotron/launch.sh`` at those tags sets
``VP=12`` for 340b and passes ``-vp 12``, and v25.05 prints 12: read as 12. Llama 4
Maverick v25.05 prints Layers 32; v25.05.01 prints 48 (the model's count) for the same
configurations and the same step times: read as 48. GPT3 175B v25.04 prints GBS 1204 at 512
GPUs; dp 16 · MBS 1 · GA 64 and the printed tokens/s give 1024: read as 1024.

**Left out, and why.**

- v25.07-v25.08.02: their READMEs print only the configuration tables, no step times.
- Truncated proxy runs: rows whose Layers is below the model's layer count (Grok-1
  v24.11.1-v25.04.02 at 8-256 GPUs: 2-32 layers; Llama 3.1 405B v24.11.1-v25.03 at 32/96/192
  GPUs: 7/21/42 layers; Llama 3.1 405B v25.04-v25.04.02 "405b-Proxy" at 32/64/128 GPUs:
  8/30/62 layers). They measure a different model than the named one.
- Rows in ``../shared/validation/public.yaml`` (its 18 ``dgxc-*`` records, from v25.05.01's
  H100 tables): the same model, machine, GPUs and precision at v25.05.01, and the same
  measurement (same step time) republished by another release (v25.05-v25.05.05's Nemotron-H
  56B, the 16-GPU Nemotron-4 15B, 256-GPU 340B, Llama 4 Maverick and DeepSeek-V3 1024-GPU H100
  rows, and Grok-1 / Llama 3.1 405B H100 512-GPU rows whose step times did not change).
- Exact duplicates across releases (same model, machine, precision, GPUs, layout and step
  time): only the first release that published the row is kept. The rule is mechanical: the
  v25.02 Nemotron-4 15B FP8 512-GPU row (2.12 s) matches v24.11.1's to the printed digit and is
  dropped with it.

Nothing in zrt is fitted on these records (``benchmarks/bench_heldout_dgxc.py``).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
MIRROR = ROOT.parent / ".mirror" / "NVIDIA+dgxc-benchmarking" / "repo"
BUNDLED = ROOT / "src" / "zrt_core" / "data" / "models" / "bundled.yaml"
#: the zrt_xai plugin's models file: grok-1 (model type ``grok-1``) is the plugin's
PLUGIN_MODELS = ROOT / "plugins" / "zrt_xai" / "src" / "zrt_xai" / "models.yaml"
PUBLIC = ROOT.parent / "shared" / "validation" / "public.yaml"
FIRST, LAST = (24, 11, 1), (25, 8, 2)

#: README path pattern -> family (the model then comes from the size in the table header)
FILES = (
    (r"llama3\.1/README(_\w+)?\.md", "llama3.1"),
    (r"nemo_megatron/README_175b\.md", "gpt3"),
    (r"nemotron/README(_\w+)?\.md", "nemotron4"),
    (r"grok1/README(_314b)?\.md", "grok1"),
    (r"llama4/(pretrain/)?README\.md", "llama4"),
    (r"deepseek_v3/pretrain(ing)?/README\.md", "deepseek"),
    (r"(nemotronh|nemotron-h)/README\.md", "nemotronh"),
)
#: (family, size as printed, lower case) -> (bundled key, id slug); size None: any
MODELS = {
    ("llama3.1", "8b"): ("llama3.1-8b", "llama3.1-8b"),
    ("llama3.1", "70b"): ("llama3.1-70b", "llama3.1-70b"),
    ("llama3.1", "405b"): ("llama3.1-405b", "llama3.1-405b"),
    ("gpt3", None): ("nemo-gpt3-175b", "gpt3-175b"),
    ("nemotron4", "15b"): ("nemotron4-15b", "nemotron4-15b"),
    ("nemotron4", "340b"): ("nemotron4-340b", "nemotron4-340b"),
    ("grok1", None): ("grok-1", "grok1-314b"),
    ("llama4", None): ("llama4-maverick", "llama4-maverick"),
    ("deepseek", None): ("deepseek-v3", "deepseek-v3"),
    ("nemotronh", None): ("nemotron-h-56b", "nemotron-h-56b"),
}
HARDWARE = {"H100": "nvidia_h100_sxm", "GB200": "nvidia_gb200_nvl72", "B200": "nvidia_b200",
            "GB300": "nvidia_gb300_nvl72", "B300": "nvidia_b300"}
HW_RE = r"(GB300|GB200|B300|B200|H100)"


def git(mirror: Path, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(mirror), *args], check=True,
                          capture_output=True, text=True).stdout


def version(tag: str) -> tuple[int, ...]:
    return tuple(int(x) for x in tag.lstrip("v").split("."))


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def num(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def tables(text: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """Markdown tables as (machine heading in force, header cells, rows). A table is a header
    line, a ``---`` separator line and the following lines holding ``|``."""
    lines = text.splitlines()
    out = []
    machine = "H100"
    i = 0
    while i < len(lines):
        line = lines[i]
        heading = re.match(r"^\s*(#+\s|\*\*)", line)
        if heading and not line.lstrip().startswith("|"):
            found = re.search(HW_RE, line)
            if found:
                machine = found.group(1)
        if (line.lstrip().startswith("|") and i + 1 < len(lines)
                and re.match(r"^\s*\|?\s*:?-{3,}", lines[i + 1])):
            header = cells(line)
            rows = []
            i += 2
            while i < len(lines) and "|" in lines[i] and lines[i].strip():
                rows.append(cells(lines[i]))
                i += 1
            out.append((machine, header, rows))
            continue
        i += 1
    return out


def seq_note(text: str) -> int | None:
    found = re.search(r"sequence length\s*=\s*(\d+)", text)
    return int(found.group(1)) if found else None


def config_rows(parsed) -> list[dict[str, Any]]:
    """Rows of the configuration tables, with the machine heading in force."""
    out = []
    for machine, header, rows in parsed:
        if "GPUs" not in header or "TP" not in header:
            continue
        for row in rows:
            if len(row) < len(header):
                continue
            cfg = dict(zip(header, row, strict=False))
            cfg["_machine"] = machine
            out.append(cfg)
    return out


def perf_columns(parsed, family: str) -> list[dict[str, Any]]:
    """One entry per (performance table, GPU column)."""
    out = []
    for _machine, header, rows in parsed:
        title = header[0]
        prec = re.search(r"\b(BF16|FP8)\b", title)
        if not prec:
            continue
        by_label = {r[0].split("(")[0].strip().lower(): r[1:] for r in rows if r}
        steps = by_label.get("training step time")
        if steps is None:
            continue
        size = re.search(r"\b(\d+)b\b", title.lower())
        inline = {k.upper(): int(v) for k, v in
                  re.findall(r"\b(TP|PP|CP|VP|EP|MBS|GA|SEQ)\s*=\s*(\d+)", title)}
        for j, head in enumerate(header[1:]):
            col = re.search(r"(\d+)\s*x?\s*" + HW_RE, head)
            if not col or j >= len(steps) or not re.match(r"^[\d.]+$", steps[j].strip()):
                continue
            gbs = re.search(r"GBS\s*=\s*(\d+)", head)
            percol = {k: by_label[k][j] for k in ("layers", "gbs", "pp", "vp")
                      if k in by_label and j < len(by_label[k])}
            tput = by_label.get("throughput in tokens per second")
            tflops = by_label.get("tflops_per_gpu")
            out.append({
                "family": family, "title": title, "precision": prec.group(1),
                "size": size.group(1) + "b" if size else None,
                "gpus": int(col.group(1)), "machine": col.group(2),
                "gbs": int(gbs.group(1)) if gbs else None, "inline": inline,
                "percol": percol, "step": float(steps[j]),
                "tput": float(tput[j]) if tput and j < len(tput) and
                re.match(r"^[\d.]+$", tput[j].strip()) else None,
                "tflops": tflops[j].strip() if tflops and j < len(tflops) else None,
                "strong": "strong scaling" in head.lower(),
            })
    return out


def pick_config(col: dict[str, Any], configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = []
    for cfg in configs:
        if cfg["_machine"] != col["machine"] or num(cfg["GPUs"]) != col["gpus"]:
            continue
        size = cfg.get("Size") or cfg.get("Model Size")
        if size and col["size"] and size.strip().lower().removesuffix("-proxy") != col["size"]:
            continue
        prec = cfg.get("Precision")
        if prec and col["precision"] not in prec.upper():
            continue
        if col["gbs"] is not None and num(cfg["GBS"]) not in (None, col["gbs"]):
            continue
        found.append(cfg)
    return found


def layout(col: dict[str, Any], configs, text: str, full_layers: int, tag: str,
           path: str) -> tuple[dict[str, Any] | None, str, list[str]]:
    """The column's layout, or None and why it is left out."""
    notes: list[str] = []
    inline, percol = col["inline"], col["percol"]
    if inline:
        lay = {"tp": inline.get("TP", 1), "pp": inline.get("PP", 1), "cp": inline.get("CP", 1),
               "vp": inline.get("VP"), "ep": inline.get("EP"), "etp": None,
               "mbs": inline.get("MBS"), "ga": inline.get("GA"), "gbs": col["gbs"],
               "seq": inline.get("SEQ"), "layers": None, "fsdp": None, "dp_printed": None}
        where = "the performance table's header"
        if percol:
            for key in ("pp", "vp", "layers", "gbs"):
                if key in percol:
                    lay[key] = num(percol[key])
            where += " and its per-column Layers/GBS/PP/VP rows"
    else:
        found = pick_config(col, configs)
        if not found:
            return None, "no configuration row for this column", notes
        if len(found) > 1:
            return None, f"{len(found)} configuration rows fit this column", notes
        cfg = found[0]
        lay = {"tp": num(cfg["TP"]), "pp": num(cfg["PP"]), "cp": num(cfg["CP"]),
               "vp": num(cfg.get("VP", "")), "ep": num(cfg.get("EP", "")),
               "etp": num(cfg.get("ETP", "")), "mbs": num(cfg["MBS"]), "ga": num(cfg["GA"]),
               "gbs": num(cfg["GBS"]), "seq": num(cfg["SeqLen"]),
               "layers": num(cfg["Layers"]), "dp_printed": num(cfg.get("DP", "")),
               "fsdp": num(cfg["FSDP"]) if "FSDP" in cfg else None,
               "proxy": "proxy" in (cfg.get("Size") or "").lower()}
        where = f"the README's {col['machine']} configuration table"
        if "EP" in cfg and cfg["EP"].upper() == "NA":
            lay["ep"] = 1
        if "ETP" in cfg and cfg["ETP"].upper() == "NA":
            lay["etp"] = 1
        if col["gbs"] is not None and lay["gbs"] != col["gbs"]:
            return None, f"GBS {col['gbs']} in the header, {lay['gbs']} in the config", notes
        if col["gbs"] is not None:
            lay["gbs"] = col["gbs"]
    # corrections (module docstring)
    if path.startswith("nemo_megatron/") and (25, 2) <= version(tag) < (25, 4) \
            and lay["vp"] == 12:
        lay["vp"] = 6
        notes.append("VP: the header prints VP=12, but the recipe's gpt3_175b_hydra.yaml at "
                     "this tag sets virtual_pipeline_model_parallel_size 6 and v25.04 "
                     "republishes the same step times with VP 6: read as 6.")
    if path == "nemotron/README.md" and (25, 4) <= version(tag) < (25, 5) \
            and col["size"] == "340b" and lay["vp"] is None:
        lay["vp"] = 12
        notes.append("VP: printed NA, but the recipe's nemotron/launch.sh at this tag sets "
                     "VP=12 for 340b (passed as -vp 12) and v25.05 prints VP 12: read as 12.")
    if path.startswith("llama4/") and tag == "v25.05" and lay["layers"] == 32:
        lay["layers"] = 48
        notes.append("Layers: printed 32; v25.05.01 prints 48 (Maverick's count) for the "
                     "same configuration and step times: read as 48.")
    if lay.get("proxy") or (lay["layers"] is not None and lay["layers"] < full_layers):
        return None, f"truncated proxy model ({lay['layers']} of {full_layers} layers)", notes
    if lay["layers"] is not None and lay["layers"] != full_layers:
        return None, f"Layers {lay['layers']} != the model's {full_layers}", notes
    if lay["seq"] is None:
        lay["seq"] = seq_note(text)
        if lay["seq"] is None:
            return None, "no sequence length stated", notes
        notes.append(f"Sequence length {lay['seq']} from the README's model-FLOPs note.")
    if None in (lay["tp"], lay["pp"], lay["cp"], lay["mbs"]):
        return None, "TP/PP/CP/MBS not all printed", notes
    notes.insert(0, f"Layout from {where}.")
    return lay, "", notes


def record(tag: str, commit: str, path: str, col: dict[str, Any], lay: dict[str, Any],
           notes: list[str], model: dict[str, Any], slug: str) -> tuple[dict[str, Any], str]:
    gpus = col["gpus"]
    tp, pp, cp, mbs = lay["tp"], lay["pp"], lay["cp"], lay["mbs"]
    dp = gpus // (tp * pp * cp)
    if dp * tp * pp * cp != gpus:
        raise SystemExit(f"{tag} {path} {col['title']} {gpus}: GPUs not divisible by TP*PP*CP")
    head = [f"Parallel: dp={dp} derived as num_gpus/(tp*pp*cp)"]
    if lay["dp_printed"] is not None and lay["dp_printed"] != dp:
        ep = lay["ep"] or 1
        how = " (= dp/EP)" if lay["dp_printed"] * ep == dp else ""
        head.append(f"(printed DP {lay['dp_printed']}{how})")
    notes = [" ".join(head) + ".", *notes]
    gbs, seq, step = lay["gbs"], lay["seq"], col["step"]
    ga = lay["ga"]
    if gbs is None and ga is not None:
        gbs = dp * mbs * ga
        notes.append(f"GBS {gbs} derived as dp*MBS*GA (not printed).")
    if col["tput"] is not None:
        from_tput = col["tput"] * step / seq
        if gbs is None or abs(from_tput - gbs) > 0.03 * gbs:
            alt = dp * mbs * ga if ga else None
            if gbs is not None and alt == gbs:
                notes.append(f"The printed tokens/s {col['tput']:.10g} implies GBS "
                             f"{from_tput:.0f}, but the printed GBS {gbs} is dp*MBS*GA: "
                             "kept GBS, tokens/s not used.")
            elif alt and abs(from_tput - alt) <= 0.03 * alt:
                notes.append(f"GBS printed {gbs}; dp*MBS*GA = {alt}, which the printed "
                             f"tokens/s agrees with: read as {alt}.")
                gbs = alt
            else:
                raise SystemExit(f"{tag} {path} {col['title']} {gpus}: GBS {gbs} x seq {seq} "
                                 f"disagrees with step x tokens/s ({from_tput:.0f} seqs)")
    if gbs is None:
        raise SystemExit(f"{tag} {path} {col['title']} {gpus}: no GBS")
    if ga is not None and dp * mbs * ga != gbs:
        notes.append(f"GA printed {ga}, but GBS {gbs} / (dp {dp} * MBS {mbs}) = "
                     f"{gbs // (dp * mbs)}: GA not used.")
    vp = lay["vp"] or 1
    if lay["vp"] is None and pp > 1:
        notes.append("VP printed NA (or not printed): read as 1, no interleaving.")
    if pp == 1 and vp != 1:
        notes.append(f"VP printed {vp} with PP 1: read as 1.")
        vp = 1
    moe = any(k in model["hf_config"] for k in ("num_local_experts", "n_routed_experts"))
    ep, etp = lay["ep"], lay["etp"]
    if not moe:
        ep, etp = ep or 1, etp or 1
    prec = col["precision"].lower()
    tps = gbs * seq / (step * gpus)
    notes.append("Measured: step_time_s published; tokens_per_s_per_gpu derived = "
                 "GBS*seq/(step*GPUs).")
    also = []
    if col["tput"] is not None:
        also.append(f"whole-job {col['tput']:.10g} tokens/s")
    if col["tflops"]:
        also.append(f"{col['tflops']} TFLOP/s/GPU")
    if ga is not None:
        also.append(f"GA {ga}")
    if also:
        notes.append("Also published: " + "; ".join(also) + ".")
    if prec == "fp8":
        notes.append("Precision: FP8 (the table says FP8; NeMo 24.x/25.x recipes' FP8 is "
                     "delayed scaling).")
    if col["strong"]:
        notes.append("Strong-scaling table (GBS fixed across GPU counts).")
    rec = {
        "id": f"heldout-dgxc-{tag.lstrip('v')}-{slug}-{col['machine'].lower()}-{gpus}gpu-{prec}",
        "source": f"NVIDIA dgxc-benchmarking {tag} (@{commit}), {path} performance table",
        "trust": "high", "workload": "train",
        "model": {"name": model["name"], "hf_config": model["hf_config"]},
        "hardware": HARDWARE[col["machine"]], "num_gpus": gpus,
        "parallel": {"tp": tp, "pp": pp, "vp": vp, "cp": cp, "ep": ep, "etp": etp, "dp": dp,
                     "sp": None, "zero": None, "fsdp": True if lay["fsdp"] else None},
        "recompute": None, "micro_batch": mbs, "global_batch": gbs, "seq_len": seq,
        "precision": prec,
        "measured": {"step_time_s": step, "tokens_per_s_per_gpu": round(tps, 1)},
        "notes": " ".join(notes),
    }
    return rec, col["machine"]


def public_keys() -> tuple[set[tuple], set[tuple]]:
    """(model name, hardware, GPUs, precision) and that plus step time, of public.yaml's
    ``dgxc-*`` records."""
    rows, steps = set(), set()
    for r in yaml.safe_load(PUBLIC.read_text()):
        if r["id"].startswith("dgxc-"):
            key = (r["model"]["name"], r["hardware"], r["num_gpus"], r["precision"])
            rows.add(key)
            steps.add((*key, float(r["measured"]["step_time_s"])))
    return rows, steps


class _PlainDumper(yaml.SafeDumper):
    """Every record spelled out: no YAML anchors for the model configs records share."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--mirror", type=Path, default=MIRROR)
    args = ap.parse_args(argv)
    configs = {m["key"]: m for f in (BUNDLED, PLUGIN_MODELS)
               for m in yaml.safe_load(f.read_text())}
    public_rows, public_steps = public_keys()
    tags = sorted((t for t in git(args.mirror, "tag").split()
                   if FIRST <= version(t) <= LAST), key=version)
    records: list[dict[str, Any]] = []
    seen: dict[tuple, str] = {}
    left: dict[str, int] = {}

    def leave(why: str) -> None:
        left[why] = left.get(why, 0) + 1

    for tag in tags:
        commit = git(args.mirror, "rev-parse", "--short=7", f"{tag}^{{commit}}").strip()
        for path in sorted(git(args.mirror, "ls-tree", "-r", "--name-only", tag).split()):
            family = next((f for pat, f in FILES if re.fullmatch(pat, path)), None)
            if family is None:
                continue
            text = git(args.mirror, "show", f"{tag}:{path}")
            parsed = tables(text)
            cfgs = config_rows(parsed)
            for col in perf_columns(parsed, family):
                key = (family, col["size"]) if (family, col["size"]) in MODELS \
                    else (family, None)
                if key not in MODELS:
                    leave(f"{family} {col['size']}: no bundled model")
                    continue
                mkey, slug = MODELS[key]
                model = configs[mkey]
                hf = model["hf_config"]
                full = hf.get("num_hidden_layers", hf.get("n_layer"))
                lay, why, notes = layout(col, cfgs, text, full, tag, path)
                where = f"{tag} {path} {col['machine']} {col['precision']} {col['gpus']}gpu"
                if lay is None:
                    leave(f"{family} {col['machine']}: {why}")
                    print(f"left out: {where}: {why}", file=sys.stderr)
                    continue
                rec, _ = record(tag, commit, path, col, lay, notes, model, slug)
                pkey = (model["name"], rec["hardware"], rec["num_gpus"], rec["precision"])
                if (tag == "v25.05.01" and pkey in public_rows) or \
                        (*pkey, rec["measured"]["step_time_s"]) in public_steps:
                    leave("in public.yaml (dgxc-*)")
                    continue
                dup = (mkey, rec["hardware"], rec["precision"], rec["num_gpus"],
                       tuple(rec["parallel"].values()), rec["micro_batch"],
                       rec["global_batch"], rec["seq_len"], rec["measured"]["step_time_s"])
                if dup in seen:
                    leave("duplicate of an earlier release")
                    continue
                seen[dup] = rec["id"]
                records.append(rec)
    # ids: add the GBS where two records of one release would share one
    ids = [r["id"] for r in records]
    for r in records:
        if ids.count(r["id"]) > 1:
            r["id"] += f"-gbs{r['global_batch']}"
    ids = [r["id"] for r in records]
    dupes = {i for i in ids if ids.count(i) > 1}
    if dupes:
        raise SystemExit(f"duplicate ids: {sorted(dupes)}")
    header = ("# Written by tools/dgxc_heldout.py: NVIDIA dgxc-benchmarking pre-training READMEs\n"
              "# (v24.11.1-v25.05.05 performance tables), held out: nothing in zrt is fitted on "
              "them.\n")
    args.out.write_text(header + yaml.dump(records, Dumper=_PlainDumper, sort_keys=False,
                                           width=100))
    print(f"wrote {len(records)} records to {args.out}")
    for why, n in sorted(left.items()):
        print(f"left out {n:3d}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
