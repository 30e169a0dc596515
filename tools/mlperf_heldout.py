"""Write ``benchmarks/data/mlperf_heldout.yaml``: NVIDIA's closed MLPerf Training submissions of
the LLM benchmarks that ``../shared/validation/public.yaml`` does not carry, as validation records.

    python tools/mlperf_heldout.py OUT_YAML [--mirrors DIR] [--public PUBLIC_YAML]
                                   [--rounds 4.0,4.1,5.0,5.1]

The results are read from bare git mirrors of ``mlcommons/training_results_v<round>``
(``DIR/mlcommons+training_results_v<round>/repo``, the layout ``fetch`` writes; ``--mirrors``
overrides ``DIR``), at their ``HEAD``. One record per (round, results directory, benchmark) of
``NVIDIA/results/<system>/<benchmark>/``, for the benchmarks gpt3, llama2_70b_lora,
llama31_405b and llama31_8b, on the machines zrt has (``systems/<system>.json``:
``accelerator_model_name``), read as the public file's MLPerf records are:

- ``measured.step_time_s``: the logged train step time (MLLOG ``tracked_stats``:
  ``train_step_time`` from v5.0, ``train_step_timing in s`` in v4.1), median over the logged
  steps of a run, then median over the runs. Where a run logs per-step values (the
  implementation's ``custom_callbacks.py``) those are used; the LoRA runs log only the mean step
  time of each block between evaluations (``mlperf_common`` ``logging.py``), and those means are
  used. Rounds whose logs carry no step time (v4.0; v4.1's LoRA and its resubmitted v4.0 GPT-3
  run log only throughput or nothing) are left out. ``tokens_per_s_per_gpu`` is derived as
  GBS · sequence / (step time · GPUs).
- The layout: the launch config the submission's ``README-<system>.md`` names (``source
  config_….sh``), its ``source``-d files followed and the Hydra defaults
  (``${oc.env:NAME,default}`` in the implementation's ``conf/*.yaml``) for what it leaves unset;
  the logged ``global_batch_size`` and ``max_sequence_length`` are preferred, and must agree
  with the config (MINIBS · dp). dp = GPUs / (tp · pp · cp).
- Precision: ``FP4=True`` with ``FP4_RECIPE=nvfp4`` → ``nvfp4``; ``FP8=True`` with
  ``FP8_RECIPE`` delayed (or none set: NeMo's ``MegatronMixedPrecision`` default) → ``fp8``,
  ``tensorwise`` → ``fp8_cs`` (zrt's name for Float8CurrentScaling); else ``bf16``. A LoRA NVFP4
  run that switches to FP8 delayed scaling at ``HEALING_ITER`` keeps only the blocks that ended
  before the switch.

Records the public file has (same round, results directory and benchmark, read from its
``source``) are left out. Model configs are the public file's (Llama 3.1 8B and GPT-3 verbatim;
Llama 3.1 405B with the MLPerf benchmark's Mixtral 8x22B tokenizer's vocabulary, 32,000, as the
MLCommons reference README's model table gives it); Llama 2 70B, which the public file lacks,
is zrt's bundled copy of ``meta-llama/Llama-2-70b-hf``'s config.json with
``max_position_embeddings`` raised to the implementation's ``model.max_position_embeddings``
(8192). The hardware is the one ``systems/<system>.json`` describes; a record notes where the
MLLOG ``submission_platform`` names another GPU. Nothing in zrt is fitted on these records
(``benchmarks/bench_heldout_mlperf.py``).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import statistics
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
#: where ``fetch`` puts its mirrors (``/work/.mirror`` beside the repository)
MIRRORS = ROOT.parent / ".mirror"
MIRROR = "mlcommons+training_results_v{round}/repo"
#: ``training_results_v5.0`` past its results commit (0fdc28f, where the mlcommons mirror
#: stands): NVIDIA's "Fix readmes and add missing files" (Michał Marcinkiewicz, 1db6367, merged
#: as "Merge pull request #1 from mmarcinkiewicz/main", d7e703f; read from a fork that carries
#: it) adds the ``config_common_blackwell.sh`` and ``config_common_cg.sh`` that the GB200
#: Llama 3.1 405B configs source but the results commit lacks. Read only for a sourced file the
#: mirror lacks; a config whose sourced file neither has is left out.
FIXES = {"5.0": ("prishajain1+training_results_v5.0/repo",
                 "d7e703fccc1c86e70cb31bac108f99072e34dba0")}
ROUNDS = ("4.0", "4.1", "5.0", "5.1")
PUBLIC = Path(os.environ.get("ZRT_SHARED") or ROOT.parent / "shared") / "validation" / "public.yaml"
BUNDLED = ROOT / "src" / "zrt_core" / "data" / "models" / "bundled.yaml"

#: benchmark directory → (name in the record's source, the id's slug, model name)
BENCHMARKS = {
    "gpt3": ("GPT-3 175B", "gpt3", "GPT-3 175B (MLPerf Training reference)"),
    "llama2_70b_lora": ("Llama 2 70B LoRA", "llama2-70b-lora", "Llama 2 70B"),
    "llama31_405b": ("Llama 3.1 405B", "llama31-405b",
                     "Llama 3.1 405B (MLPerf Training benchmark, Mixtral 8x22B tokenizer)"),
    "llama31_8b": ("Llama 3.1 8B", "llama31-8b", "Llama 3.1 8B"),
}
#: ``accelerator_model_name`` of ``systems/<system>.json`` → zrt hardware id (first match)
HARDWARE = (
    (r"\bGB300\b", "nvidia_gb300_nvl72"), (r"\bGB200\b", "nvidia_gb200_nvl72"),
    (r"\bB300\b", "nvidia_b300"), (r"\bB200\b", "nvidia_b200"), (r"\bH200\b", "nvidia_h200"),
    (r"\bH800\b", "nvidia_h800"), (r"\bH100\b", "nvidia_h100_sxm"),
    (r"\bA100\b.*80\s*GB", "nvidia_a100_sxm_80g"),
)
#: the Llama 3.1 405B benchmark's tokenizer: "we replace the paper's TikTokenizer with the
#: Mixtral 8x22b tokenizer" (the implementation README), whose "Model details" table in the
#: MLCommons reference README (mlcommons/training large_language_model_pretraining/nemo, which
#: that README links) gives "Vocab size | 32,000"
LLAMA31_405B_VOCAB = 32000
STEP_KEYS = ("train_step_time", "train_step_timing in s", "train_step_timing")
TRUE = ("true", "1", "yes")


def _git(git_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "--git-dir", str(git_dir), *args], capture_output=True,
                          text=True, check=False)


@cache
def _files(git_dir: Path, commit: str = "HEAD") -> tuple[str, ...]:
    out = _git(git_dir, "ls-tree", "-r", "--name-only", commit)
    if out.returncode:
        raise SystemExit(f"{git_dir}: not a readable git mirror ({out.stderr.strip()})")
    return tuple(out.stdout.splitlines())


@cache
def _show(git_dir: Path, path: str, commit: str = "HEAD") -> str | None:
    out = _git(git_dir, "show", f"{commit}:{path}")
    return out.stdout if out.returncode == 0 else None


def _head(git_dir: Path) -> str:
    return _git(git_dir, "rev-parse", "--short=8", "HEAD").stdout.strip()


# -- MLLOG ---------------------------------------------------------------------------------


def events(text: str):
    for line in text.splitlines():
        at = line.find(":::MLLOG ")
        if at >= 0:
            yield json.loads(line[at + len(":::MLLOG "):])


def read_run(text: str) -> dict[str, Any]:
    """One result file: its logged hyperparameters, per-step and per-block step times (each
    block's with the step it ended at), and run minutes."""
    run: dict[str, Any] = {"logged": {}, "per_step": [], "blocks": [], "status": None}
    pending: list[float] = []
    times = {}
    for e in events(text):
        key, value, meta = e["key"], e.get("value"), e.get("metadata") or {}
        if key == "tracked_stats" and isinstance(value, dict):
            for k, v in value.items():
                if k == "throughput":
                    run["throughput"] = True
                if k in STEP_KEYS:
                    if str(meta.get("file", "")).endswith("logging.py"):
                        pending.append(float(v))  # mlperf_common: a block's mean step time
                    else:
                        run["per_step"].append(float(v))
        elif key == "block_stop":
            run["blocks"] += [(x, meta.get("step")) for x in pending]
            pending = []
        elif key in ("run_start", "run_stop"):
            times[key] = e["time_ms"]
            if key == "run_stop":
                run["status"] = meta.get("status")
        elif key in ("global_batch_size", "max_sequence_length", "gradient_accumulation_steps",
                     "submission_platform", "submission_division", "submission_org",
                     "submission_benchmark", "lora_rank", "lora_alpha"):
            run["logged"].setdefault(key, value)
    run["blocks"] += [(x, None) for x in pending]
    if len(times) == 2:
        run["minutes"] = (times["run_stop"] - times["run_start"]) / 60000
    return run


# -- launch configs --------------------------------------------------------------------------


def parse_config(git_dir: Path, path: str, fixes: tuple[Path, str] | None,
                 env: dict[str, str] | None = None, used: list[str] | None = None
                 ) -> tuple[dict[str, str], list[str]]:
    """The environment a launch config exports: ``export K=V``, ``: "${K:=V}"``, ``unset K``
    and ``source $(dirname ${BASH_SOURCE[0]})/F.sh`` in order. ``if`` blocks test opt-in
    switches a submission run leaves unset (``NO_CKPT``, ``LOAD_MINIMAL_NUM_SAMPLES``,
    ``MLPERF_VERSION``...): their ``then`` branch is skipped and an ``else`` branch taken.
    Returns the environment and the files read (a file missing from the mirror is read from
    ``fixes`` and marked so, or listed as ``missing:``)."""
    env = {} if env is None else env
    used = [] if used is None else used
    text = _show(git_dir, path)
    if text is None and fixes is not None:
        text = _show(fixes[0], path, fixes[1])
        if text is not None:
            used.append(f"fixes:{path}")
    elif text is not None:
        used.append(path)
    if text is None:
        used.append(f"missing:{path}")
        return env, used
    folder = path.rsplit("/", 1)[0]
    skip: list[bool] = []  # per open if-block: is the current branch skipped
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if re.match(r"if\b", line):
            skip.append(True)
            continue
        if line == "else" or line.startswith("elif"):
            if skip:
                skip[-1] = line != "else"
            continue
        if line == "fi":
            if skip:
                skip.pop()
            continue
        if any(skip):
            continue
        if m := re.match(r"source\s+\$\(dirname \$\{BASH_SOURCE\[0\]\}\)/(\S+)", line):
            parse_config(git_dir, f"{folder}/{m.group(1)}", fixes, env, used)
        elif m := re.match(r"(?:export\s+)?([A-Za-z_]\w*)=(.*)$", line):
            env[m.group(1)] = _value(m.group(2), env, m.group(1))
        elif m := re.match(r':\s+"\$\{([A-Za-z_]\w*):=([^}]*)\}"', line):
            env.setdefault(m.group(1), _value(m.group(2), env, m.group(1)))
        elif m := re.match(r"unset\s+(\w+)", line):
            env.pop(m.group(1), None)
    return env, used


def _value(text: str, env: dict[str, str], name: str) -> str:
    text = text.strip().rstrip(";").strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1]
    if m := re.fullmatch(r"\$\{(\w+):=([^}]*)\}", text):  # K="${K:=V}"
        return env.get(m.group(1), m.group(2))
    return re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), m.group(0)), text)


def hydra_fields(git_dir: Path, folder: str) -> dict[str, tuple[str | None, str | None]]:
    """Each field of the implementation's Hydra configs (``conf/*.yaml``) → (the environment
    knob it reads, its default), or (None, the literal value); the first occurrence of a field
    name wins."""
    out: dict[str, tuple[str | None, str | None]] = {}
    for path in _files(git_dir):
        if not (path.startswith(f"{folder}/conf/") and path.endswith(".yaml")
                and path.count("/") == folder.count("/") + 2):
            continue
        for line in (_show(git_dir, path) or "").splitlines():
            found = re.match(r"\s*(\w+):\s*(\S.*)$", line)
            if not found or found.group(1) in out:
                continue
            value = found.group(2)
            if env := re.search(r"oc\.env:(\w+)(?:,([^${}]*))?\}", value):
                default = env.group(2)
                out[found.group(1)] = (env.group(1), None if default is None
                                       else default.strip().strip("'\""))
            elif "${" not in value:
                out[found.group(1)] = (None, value.split(" #")[0].strip().strip("'\""))
    return out


def config_path(git_dir: Path, bench: str, results_dir: str) -> str | None:
    """The launch config ``README-<results dir>.md`` names (``benchmarks/…/config_….sh``)."""
    readme = next((p for p in _files(git_dir)
                   if p.startswith(f"NVIDIA/benchmarks/{bench}/implementations/")
                   and p.endswith(f"/README-{results_dir}.md")), None)
    if readme is None:
        return None
    found = re.search(r"`(benchmarks/[^`]*/config_[^`/]*\.sh)`", _show(git_dir, readme) or "")
    return f"NVIDIA/{found.group(1)}" if found else None


# -- records ---------------------------------------------------------------------------------


def public_keys(public: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """(round, results directory, benchmark) of the public file's MLPerf records."""
    names = {v[0]: k for k, v in BENCHMARKS.items()}
    keys = set()
    for r in public:
        found = re.match(r"MLPerf Training v([\d.]+) closed, ([^,]+), .*\(([^)]+)\)\s*$",
                         str(r.get("source", "")))
        if found and found.group(2) in names:
            keys.add((found.group(1), found.group(3), names[found.group(2)]))
    return keys


def model_configs(public: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    by_name = {r["model"]["name"]: r["model"]["hf_config"] for r in public if r.get("model")}
    bundled = {m["name"]: m["hf_config"]
               for m in yaml.safe_load(BUNDLED.read_text(encoding="utf-8"))}
    return {
        "gpt3": dict(by_name["GPT-3 175B (MLPerf Training reference)"]),
        "llama31_405b": {**by_name["Llama 3.1 405B"], "vocab_size": LLAMA31_405B_VOCAB},
        "llama31_8b": dict(by_name["Llama 3.1 8B"]),
        "llama2_70b_lora": dict(bundled["Llama 2 70B"]),
    }


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _sig(x: float) -> float:
    """The public file's rounding: five significant digits from 1 s up (18.374, 9.4963),
    four below (0.9451)."""
    return float(f"{x:.4g}") if x < 1 else round(x, max(0, 5 - len(str(int(x)))))


def _int(value: str | None) -> int | None:
    if value is None or str(value).lower() in ("null", "none", ""):
        return None
    return int(str(value))


def _flag(value: str | None) -> bool:
    return str(value).lower() in TRUE


def lora_facts(git_dir: Path, folder: str, logged: dict[str, Any]) -> str:
    """The LoRA adapters and loss as the implementation's ``train.py`` builds them."""
    text = _show(git_dir, f"{folder}/train.py") or ""
    peft = re.search(r"LoRA\((.*?)\n\s*\)", text, re.S)
    args = dict(re.findall(r"(\w+)=([^,\n]+)", peft.group(1))) if peft else {}
    targets = re.search(r"target_modules=\[([^\]]*)\]", text)
    lora = (f"LoRA rank {logged.get('lora_rank', args.get('dim'))} alpha "
            f"{logged.get('lora_alpha', args.get('alpha'))} (logged lora_rank/lora_alpha)")
    if targets:
        lora += " on " + targets.group(1).replace('"', "").replace("'", "")
    if "dropout" in args:
        lora += f", dropout {args['dropout']}"
    clauses = [lora + " (train.py LoRA(...))", "base weights frozen", "packed sequences"]
    if "cross_entropy_loss_fusion=False" in text:
        clauses.append("train.py sets cross_entropy_loss_fusion=False")
    return "; ".join(clauses)


def build(rnd: str, git_dir: Path, fixes: tuple[Path, str] | None, results_dir: str,
          bench: str, configs: dict[str, dict[str, Any]], skipped: list[str]
          ) -> dict[str, Any] | None:
    where = f"v{rnd} {results_dir}/{bench}"
    system = json.loads(_show(git_dir, f"NVIDIA/systems/{results_dir}.json") or "{}")
    if not system:
        skipped.append(f"{where}: no systems/{results_dir}.json")
        return None
    gpu = str(system.get("accelerator_model_name", ""))
    hardware = next((hw for pat, hw in HARDWARE if re.search(pat, gpu)), None)
    if hardware is None:
        skipped.append(f"{where}: accelerator {gpu!r} is none of zrt's machines")
        return None
    if str(system.get("division", "")).lower() != "closed":
        skipped.append(f"{where}: division {system.get('division')!r}")
        return None
    num_gpus = int(system["number_of_nodes"]) * int(system["accelerators_per_node"])
    results = sorted(p for p in _files(git_dir)
                     if re.fullmatch(rf"NVIDIA/results/{re.escape(results_dir)}/{bench}/"
                                     r"result_\d+\.txt", p))
    runs = [read_run(_show(git_dir, p) or "") for p in results]
    if not any(r["per_step"] or r["blocks"] for r in runs):
        only = " (only a throughput, samples/s)" if any(r.get("throughput") for r in runs) \
            else " (only block/eval timestamps)"
        skipped.append(f"{where}: the logs carry no train step time{only}")
        return None

    cfg_path = config_path(git_dir, bench, results_dir)
    if cfg_path is None:
        skipped.append(f"{where}: no README-{results_dir}.md naming a launch config")
        return None
    env, used = parse_config(git_dir, cfg_path, fixes)
    if missing := [u for u in used if u.startswith("missing:")]:
        skipped.append(f"{where}: {cfg_path} sources files not published ({', '.join(missing)})")
        return None
    folder = cfg_path.rsplit("/", 1)[0]
    fields = hydra_fields(git_dir, folder)

    def knob(*names: str) -> str | None:
        """A Hydra field's value (the first of ``names`` the configs have): the launch
        config's export of its knob, else the field's default; None for null."""
        for name in names:
            if name in fields:
                var, default = fields[name]
                value = env.get(var, default) if var else default
                return None if value is None or value.lower() in ("null", "none") else value
        return None

    def source_of(*names: str) -> str:
        name = next((n for n in names if n in fields), names[0])
        var = fields.get(name, (None, None))[0]
        if var is None:
            return f"no {name} field in conf/*.yaml"
        return f"{var}={env[var]}" if var in env else f"{var} unset: Hydra default"

    family = "lora" if bench == "llama2_70b_lora" else "pretrain"
    tp, pp, cp = (_int(knob(f"{k}_parallel_size")) or 1
                  for k in ("tensor_model", "pipeline_model", "context"))
    vp = (_int(knob("virtual_pipeline_model_parallel_size")) or 1) if pp > 1 else 1
    mbs = _int(knob("micro_batch_size"))
    minibs = _int(env.get("MINIBS"))
    nodes, per_node = _int(knob("num_nodes")), _int(knob("devices"))
    dp = num_gpus // (tp * pp * cp)
    logged = {k: v for r in runs for k, v in r["logged"].items()}
    gbs = logged.get("global_batch_size")
    problems = []
    if tp * pp * cp * dp != num_gpus:
        problems.append(f"tp·pp·cp = {tp * pp * cp} does not divide {num_gpus} GPUs")
    if nodes and per_node and nodes * per_node != num_gpus:
        problems.append(f"config runs {nodes}×{per_node} GPUs, the system has {num_gpus}")
    if gbs is None or minibs is None or int(gbs) != minibs * dp:
        problems.append(f"logged GBS {gbs} ≠ MINIBS {minibs} × dp {dp}")
    if mbs is None or (gbs and int(gbs) % (mbs * dp)):
        problems.append(f"micro-batch {mbs} does not divide the per-replica batch")
    if problems:
        skipped.append(f"{where}: {cfg_path}: " + "; ".join(problems))
        return None
    gbs = int(gbs)
    seq = logged.get("max_sequence_length")
    seq_from = "logged max_sequence_length"
    if seq is None:
        seq = _int(knob("encoder_seq_length"))
        seq_from = f"not logged: encoder_seq_length, {source_of('encoder_seq_length')}"
    if seq is None:
        skipped.append(f"{where}: sequence length neither logged nor in the config")
        return None
    seq = int(seq)

    notes = [f"Parallel: dp={dp} derived as num_gpus/(tp*pp*cp) (not printed)."]
    fp4, fp8 = _flag(knob("fp4")), _flag(knob("fp8"))
    healing = _int(knob("healing_iter")) or 0
    if fp4:
        if str(knob("fp4_recipe")).lower() != "nvfp4":
            skipped.append(f"{where}: FP4 recipe {knob('fp4_recipe')!r} not modelled")
            return None
        precision = "nvfp4"
        bf16_ends = "first_last_layers_bf16 " + ("on" if _flag(knob("first_last_layers_bf16"))
                                                  else "off")
        notes.append(f"Precision: NVFP4 (FP4=True, FP4_RECIPE=nvfp4, FP8=False; {bf16_ends}).")
    elif fp8:
        recipe = (knob("fp8_recipe") or "delayed").lower()
        precision = {"delayed": "fp8", "tensorwise": "fp8_cs", "mxfp8": "mxfp8"}.get(recipe)
        if precision is None:
            skipped.append(f"{where}: FP8 recipe {recipe!r} not modelled")
            return None
        what = {"fp8": "Transformer Engine delayed scaling", "fp8_cs":
                "Transformer Engine current per-tensor scaling (Float8CurrentScaling)",
                "mxfp8": "MXFP8 block scaling"}[precision]
        hybrid = "hybrid E4M3/E5M2" if _flag(knob("fp8_hybrid")) else "E4M3"
        how_set = source_of("fp8_recipe") if "fp8_recipe" in fields else \
            "no fp8_recipe field: NeMo MegatronMixedPrecision's default fp8_recipe='delayed'"
        notes.append(f"Precision: FP8 ({what}, {hybrid}; {how_set}).")
    else:
        precision = "bf16"
        notes.append("Precision: bf16 (FP8 and FP4 off).")

    # step times: per-step values where logged, else the per-block means
    per_run, kinds, left = [], set(), 0
    for r in runs:
        if r["per_step"]:
            values, kind = r["per_step"], "per-step"
        else:
            values, kind = [x for x, _ in r["blocks"]], "per-block mean"
            if fp4 and healing:
                keep = [x for x, end in r["blocks"] if end is not None and end < healing - 1]
                left += len(values) - len(keep)
                values = keep
        if values:
            per_run.append(_median(values))
            kinds.add(kind)
    if not per_run:
        skipped.append(f"{where}: no step time logged before the NVFP4→FP8 switch")
        return None
    step = _median(per_run)
    tok = gbs * seq / (_sig(step) * num_gpus)  # from the rounded step, as the public file
    statuses = [r["status"] for r in runs]
    minutes = [r["minutes"] for r in runs if "minutes" in r]
    how = " and ".join(sorted(kinds))
    notes.append(
        f"Measured: step_time_s = median logged train_step_time ({how} values of MLLOG "
        f"tracked_stats; median over logged values, median over {len(per_run)} runs); "
        "tokens_per_s_per_gpu derived = GBS*seq/(step*GPUs).")
    block_runs = [_median([x for x, _ in r["blocks"]]) for r in runs
                  if r["per_step"] and r["blocks"]]
    if block_runs:
        other = _median(block_runs)
        notes.append(f"The runs' per-block mean step times (mlperf_common, between "
                     f"evaluations) give {_sig(other)} s ({other / step - 1:+.1%}).")
    if fp4 and healing:
        notes.append(
            f"NVFP4 with FP8 'healing': HEALING_ITER={healing}, HEALING_PRECISION="
            f"{knob('healing_precision')} (the run switches to FP8 at that step): only blocks "
            f"that ended before it are used ({left} block means from across or after the "
            "switch left out).")
    also = []
    if minutes:
        also.append(f"run minutes (run_start->run_stop) median {_median(minutes):.3f}")
    if (ga := logged.get("gradient_accumulation_steps")) is not None:
        also.append(f"grad_accum {int(float(ga))}")
    if also:
        notes.append("Also published: " + "; ".join(also) + ".")
    if bad := [s for s in statuses if s != "success"]:
        notes.append(f"Run status: {len(statuses) - len(bad)} of {len(statuses)} runs "
                     f"logged success ({', '.join(map(str, bad))} kept: step time is valid).")
    sp_value = knob("sequence_parallel")
    sp = _flag(sp_value) if sp_value is not None else None
    rec_fields = ("activations_checkpoint_granularity", "recompute_granularity")
    recompute = (knob(*rec_fields) or "none").lower()
    dist_opt = knob("use_distributed_optimizer")
    zero = 1 if dist_opt is None or _flag(dist_opt) else 0
    fixes_used = [u.removeprefix("fixes:") for u in used if u.startswith("fixes:")]
    cfg_files = ", ".join(u.rsplit("/", 1)[-1] for u in used if not u.startswith("fixes:"))
    notes.append(
        f"Layout: {cfg_path.rsplit('/', 1)[-1]} (the launch config README-{results_dir}.md "
        f"names; read with {cfg_files}"
        + (f"; {', '.join(f.rsplit('/', 1)[-1] for f in fixes_used)} from NVIDIA's "
           "post-results fix commit of training_results_v5.0 (d7e703f), missing at the results "
           "commit" if fixes_used else "")
        + f"): tp {tp}, pp {pp}, vp {vp}, cp {cp}, micro-batch {mbs}, MINIBS {minibs}; "
        f"GBS {gbs} logged (global_batch_size) = MINIBS*dp; seq {seq} ({seq_from}). "
        f"Sequence parallel {sp} ({source_of('sequence_parallel')}); recompute {recompute} "
        f"({source_of(*rec_fields)}); distributed optimizer {'on' if zero else 'off'} "
        f"({source_of('use_distributed_optimizer')}).")
    extra = []
    if _flag(env.get("FULL_CUDA_GRAPH")):
        extra.append("FULL_CUDA_GRAPH on (whole iteration as CUDA graph)")
    elif _flag(knob("enable_cuda_graph")):
        extra.append("MCORE_CUDA_GRAPH on")
    if tp > 1:
        extra.append(f"TP comm overlap {'on' if _flag(knob('ub_tp_comm_overlap')) else 'off'}")
    if pp > 1 and _flag(knob("account_for_embedding_in_pipeline_split")) \
            and _flag(knob("account_for_loss_in_pipeline_split")):
        extra.append("account_for_embedding/loss_in_pipeline_split on (ASYM_PP_EMBED/LOSS)")
    if precision in ("fp8", "fp8_cs"):
        for field in ("fp8_params", "fp8_param_gather"):
            if field in fields:
                extra.append(f"{field} {'on' if _flag(knob(field)) else 'off'} "
                             f"({source_of(field)})")
    if _flag(knob("fp8_dot_product_attention")):
        extra.append(f"FP8 dot-product attention on ({source_of('fp8_dot_product_attention')})")
    if (nvls := env.get("NCCL_NVLS_ENABLE")) is not None:
        extra.append(f"NCCL_NVLS_ENABLE={nvls}")
    if family == "lora":
        extra.append(lora_facts(git_dir, folder, logged))
    if extra:
        notes.append("Config: " + "; ".join(extra) + ".")
    model_note = {
        "llama31_405b": f"Model: Llama 3.1 405B dimensions (public file's config) with vocab_size "
                        f"{LLAMA31_405B_VOCAB}: the benchmark uses the Mixtral 8x22B tokenizer "
                        "(implementation README), whose vocab the MLCommons reference README's "
                        "model table gives as 32,000; seq 8192 logged.",
        "llama31_8b": "Model: Llama 3.1 8B config as in the public file (vocab 128256: the "
                      "benchmark uses the Llama 3.1 8B tokenizer, implementation README / "
                      "data_scripts/download_8b.sh; the reference README's table says 128,000 "
                      "regular tokens); trained from scratch; seq 8192 logged.",
        "llama2_70b_lora": "Model: meta-llama/Llama-2-70b-hf config.json (zrt's bundled copy; "
                           "the public file has no Llama 2 70B); train.py builds NeMo "
                           "Llama2Config70B(seq_length=encoder_seq_length), RoPE unscaled.",
        "gpt3": "Model: GPT-3 175B as the public file's MLPerf records give it.",
    }[bench]
    notes.append(model_note)
    hf_config = copy.deepcopy(configs[bench])
    positions = _int(knob("max_position_embeddings"))
    if positions and positions > int(hf_config.get("max_position_embeddings") or 0):
        notes.append(
            f"max_position_embeddings {hf_config['max_position_embeddings']} -> {positions}: "
            f"the implementation's model.max_position_embeddings "
            f"({source_of('max_position_embeddings')}), as the public file's long-sequence "
            "Llama 2 records carry the trained length.")
        hf_config["max_position_embeddings"] = positions
    if platform := logged.get("submission_platform"):
        notes.append(f"Source notes: Submission platform: {platform}.")
        said = next((hw for pat, hw in HARDWARE if re.search(pat, str(platform))), None)
        if said is not None and said != hardware:
            notes.append(f"The MLLOG submission_platform names another GPU than "
                         f"systems/{results_dir}.json ({gpu!r}) and the launch config "
                         f"({cfg_path.rsplit('/', 1)[-1]}); the system description is "
                         "taken.")
    name, slug, model_name = BENCHMARKS[bench]
    short = re.split(r"_n(?:gpu)?\d+_|_ngc|_preview|_n\d+$", results_dir)[0]
    return {
        "id": f"heldout-mlperf-v{rnd}-{slug}-{short}-{num_gpus}gpu",
        "source": f"MLPerf Training v{rnd} closed, {name}, NVIDIA result logs + config "
                  f"({results_dir})",
        "trust": "high", "workload": "train",
        "model": {"name": model_name, "hf_config": hf_config},
        "hardware": hardware, "num_gpus": num_gpus,
        "parallel": {"tp": tp, "pp": pp, "vp": vp, "cp": cp, "ep": 1, "etp": 1, "dp": dp,
                     "sp": sp, "zero": zero, "fsdp": False},
        "recompute": recompute, "micro_batch": mbs, "global_batch": gbs, "seq_len": seq,
        "precision": precision,
        "measured": {"step_time_s": _sig(step), "tokens_per_s_per_gpu": round(tok, 1)},
        "notes": " ".join(notes),
    }


def records(mirrors: Path, public: list[dict[str, Any]], rounds: tuple[str, ...]
            ) -> tuple[list[dict[str, Any]], list[str]]:
    have = public_keys(public)
    configs = model_configs(public)
    out: list[dict[str, Any]] = []
    skipped: list[str] = []
    for rnd in rounds:
        git_dir = mirrors / MIRROR.format(round=rnd)
        fixes = None
        if rnd in FIXES and (mirrors / FIXES[rnd][0]).exists():
            fixes = (mirrors / FIXES[rnd][0], FIXES[rnd][1])
        pairs = sorted({(m.group(1), m.group(2)) for p in _files(git_dir)
                        if (m := re.fullmatch(r"NVIDIA/results/([^/]+)/([^/]+)/result_\d+\.txt",
                                              p)) and m.group(2) in BENCHMARKS})
        for results_dir, bench in pairs:
            if (rnd, results_dir, bench) in have:
                skipped.append(f"v{rnd} {results_dir}/{bench}: in public.yaml")
                continue
            rec = build(rnd, git_dir, fixes, results_dir, bench, configs, skipped)
            if rec is not None:
                rec["notes"] += f" Mirror: training_results_v{rnd}@{_head(git_dir)}."
                out.append(rec)
    return out, skipped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--mirrors", type=Path, default=MIRRORS,
                    help=f"folder of the git mirrors (default {MIRRORS})")
    ap.add_argument("--public", type=Path, default=PUBLIC)
    ap.add_argument("--rounds", default=",".join(ROUNDS))
    args = ap.parse_args(argv)
    public = yaml.safe_load(args.public.read_text(encoding="utf-8"))
    recs, skipped = records(args.mirrors, public, tuple(args.rounds.split(",")))
    text = (
        "# Held-out training records: NVIDIA's closed MLPerf Training LLM submissions (v"
        + ", v".join(args.rounds.split(",")) + ")\n"
        "# that ../shared/validation/public.yaml does not carry, read as its MLPerf records are.\n"
        f"# Built by tools/mlperf_heldout.py ({len(recs)} records). Nothing in zrt is fitted on "
        "them\n# (benchmarks/bench_heldout_mlperf.py).\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + yaml.safe_dump(recs, sort_keys=False, width=100,
                                              allow_unicode=True), encoding="utf-8")
    for line in skipped:
        print(f"left out: {line}")
    print(f"wrote {len(recs)} records to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
