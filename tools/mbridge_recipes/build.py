"""Build megatron_bridge.yaml from harness JSON dumps (+ 25.09 YAML perf matrix)."""
import json, glob, re, yaml, os
TAGS = {"v0.1.0rc4": "25.09", "v0.2.0": "25.11", "v0.3.0": "26.02", "v0.3.1": "26.02.01", "v0.4.0": "26.04",
        "v0.4.2": "26.04.01", "v0.5.1": "26.06", "381d0b825": "26.06.01", "HEAD": "26.08"}
# tags whose configs are perf_recipes functions (<model>_pretrain_<n>gpu_<gpu>_<precision>_config);
# 26.06.01 has no release tag: its summary landed on main in 381d0b825 (2026-07-22), read there
PERF_RECIPES = ("381d0b825", "HEAD")
DENSE = re.compile(r"^(llama|nemotronh_56b|wan|qwen3_8b)")
PREC = {"bf16": "bf16", "fp8_cs": "fp8_cs", "fp8cs": "fp8_cs", "fp8_mx": "fp8_mx", "fp8mx": "fp8_mx", "nvfp4": "nvfp4", "fp8_ss": "fp8_ss"}
U = "__unset__"
def g(cfg, k):
    v = cfg.get(k, U)
    return None if v == U else v
def isset(cfg, k): return cfg.get(k, U) != U
def fp8_dpa(cfg, unresolved):
    """MixedPrecisionConfig.fp8_dot_product_attention: the config's own write, else the
    dataclass default False when the config is one of training/mixed_precision.py's presets
    (none of them sets it, at every tag read); another recipe's object: unresolved."""
    mp = cfg.get("mixed_precision")
    m = re.match(r"'([^']*)' (\{.*)$", mp, re.S) if isinstance(mp, str) else None
    if m is None:
        unresolved.append("fp8_dot_product_attention"); return None
    writes = json.loads(m.group(2))
    if "fp8_dot_product_attention" in writes: return bool(writes["fp8_dot_product_attention"])
    if m.group(1).startswith("megatron.bridge.training.mixed_precision."): return False
    unresolved.append("fp8_dot_product_attention"); return None
rows = []
import subprocess
MIRROR = os.environ.get("MB", "/work/.mirror/NVIDIA-NeMo+Megatron-Bridge/repo")
PROVIDER = [("deepseek_v3", "deepseek/deepseek_provider.py"), ("qwen3_vl", "qwen_vl/qwen3_vl_provider.py"),
            ("qwen3_", "qwen/qwen_provider.py"), ("gpt_oss", "gpt_oss/gpt_oss_provider.py"),
            ("kimi", "kimi/kimi_provider.py"), ("nemotron_3", "nemotronh/nemotron_h_provider.py")]
_prov_cache = {}
def provider_dispatcher(tag, model):
    """The provider-class default dispatcher where the model's provider file at the tag sets only 'alltoall'."""
    rel = next((p for prefix, p in PROVIDER if model.startswith(prefix)), None)
    if rel is None: return None, None
    path = f"src/megatron/bridge/models/{rel}"
    key = (tag, path)
    if key not in _prov_cache:
        try:
            text = subprocess.run(["git", "-C", MIRROR, "show", f"{tag}:{path}"], capture_output=True, text=True, check=True).stdout
        except subprocess.CalledProcessError:
            text = ""
        vals = set(re.findall(r'moe_token_dispatcher_type: str = "(\w+)"', text))
        _prov_cache[key] = vals.pop() if len(vals) == 1 else None
    return _prov_cache[key], path
MBX = os.environ.get("MBX", "/tmp/mbx")  # harness.py's output folder
LAYOUT_CODES = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}
def pp_layout(v):
    """model.pipeline_model_parallel_layout as Megatron-Core's layout string (the recipes give
    either the string or one list of layer kinds per virtual stage); None when unset."""
    if v is None or isinstance(v, str): return v
    return "|".join("".join(LAYOUT_CODES[k] for k in stage) for stage in v)
for f in sorted(glob.glob(f"{MBX}/lib-*.json")):
    tag, gpu = os.path.basename(f)[4:-5].rsplit("-", 1)
    if tag not in TAGS: continue
    seen = set()
    for r in json.load(open(f)):
        if "error" in r: continue
        c = r["cfg"]; fn = r["func"]
        if tag in PERF_RECIPES:
            m = re.match(rf"(.+)_pretrain_(\d+)gpu_{gpu}_(bf16|fp8cs|fp8mx|nvfp4)(?:_(.+))?_config$", fn)
            if not m: continue
            model, ngpu, prec, variant = m.group(1), int(m.group(2)), PREC[m.group(3)], m.group(4) or "default"
            config = fn + "()"
        else:
            model = re.sub(rf"(_pretrain_config)?_{gpu}(_config)?$", "", fn)
            prec = PREC[r["precision"]]
            tok = {"fp8_cs": "FP8_CS", "fp8_mx": "FP8_MX", "bf16": "BF16", "nvfp4": "NVFP4", "fp8_ss": "FP8_SS"}[prec]
            names = [n for n in r["base_names"] if f"_{gpu.upper()}_" in n and f"_{tok}" in n]
            if not names: continue
            versioned = [n for n in names if re.search(r"_V\d+$", n)]
            if r["variant"] and versioned:
                vname = [n for n in versioned if n.endswith("_" + r["variant"].upper())]
                if not vname: continue  # v2 requested, fell back to v1: same as the v1 row
                name, variant = vname[0], r["variant"]
            else:  # unversioned config (get_workload_base_config's fallback): one row, any variant
                name, variant = names[0], "default"
            ngpu = r["base"]["num_gpus"]
            config = f"{fn}(precision={r['precision']!r}" + (f", config_variant={r['variant']!r}" if r["variant"] else "") + f") with {name}"
        if DENSE.match(model): continue
        key = (model, gpu, prec, variant, ngpu)
        if key in seen: continue
        seen.add(key)
        unresolved = []
        def val(k, field):
            if not isset(c, k):
                unresolved.append(field); return None
            return g(c, k)
        dt = val("model.moe_token_dispatcher_type", "moe_token_dispatcher_type")
        be = g(c, "model.moe_flex_dispatcher_backend") if dt == "flex" else None
        if dt is None and isset(c, "model.moe_flex_dispatcher_backend") and g(c, "model.moe_flex_dispatcher_backend") is not None:
            be = g(c, "model.moe_flex_dispatcher_backend")  # backend named, dispatcher type left to the recipe
        seq = g(c, "model.seq_length") or g(c, "dataset.sequence_length") or g(c, "dataset.seq_length")
        if seq is None: unresolved.append("seq_len")
        vp = g(c, "model.virtual_pipeline_model_parallel_size")
        ovl = c.get("comm_overlap.overlap_moe_expert_parallel_comm", U)
        # unset -> False: training/comm_overlap.py CommOverlapConfig setup disables both unless set
        ovl = False if ovl == U else ovl
        dw = c.get("comm_overlap.delay_wgrad_compute", U)
        dw = False if dw == U else dw
        row = {
            "release": TAGS[tag], "model": model, "gpu": gpu, "precision": prec, "variant": variant, "num_gpus": ngpu,
            "tp": val("model.tensor_model_parallel_size", "tp"), "pp": val("model.pipeline_model_parallel_size", "pp"),
            "vp": vp, "cp": val("model.context_parallel_size", "cp"), "ep": val("model.expert_model_parallel_size", "ep"),
            "etp": g(c, "model.expert_tensor_parallel_size"),
            "mbs": val("train.micro_batch_size", "mbs"), "gbs": val("train.global_batch_size", "gbs"), "seq_len": seq,
            "moe_token_dispatcher_type": dt, "moe_flex_dispatcher_backend": be,
            "moe_a2a_overlap": None if ovl == U else ovl, "delay_wgrad_compute": None if dw == U else dw,
            "moe_shared_expert_overlap": val("model.moe_shared_expert_overlap", "moe_shared_expert_overlap"),
            "cuda_graph_impl": val("model.cuda_graph_impl", "cuda_graph_impl"),
            "cuda_graph_scope": val("model.cuda_graph_scope", "cuda_graph_scope"),
            "recompute_granularity": val("model.recompute_granularity", "recompute_granularity"),
            "recompute_modules": val("model.recompute_modules", "recompute_modules"),
            "recompute_num_layers": g(c, "model.recompute_num_layers"),
            "moe_pad_expert_input_to_capacity": g(c, "model.moe_pad_expert_input_to_capacity"),
            "moe_expert_capacity_factor": g(c, "model.moe_expert_capacity_factor"),
            "moe_expert_rank_capacity_factor": g(c, "model.moe_expert_rank_capacity_factor"),
            "moe_permute_fusion": val("model.moe_permute_fusion", "moe_permute_fusion"),
            "moe_router_fusion": val("model.moe_router_fusion", "moe_router_fusion"),
            "cpu_offloading_num_layers": g(c, "model.cpu_offloading_num_layers"),
            "offload_modules": g(c, "model.offload_modules") if g(c, "model.fine_grained_activation_offloading") else None,
            "use_megatron_fsdp": bool(g(c, "ddp.use_megatron_fsdp")),
            "fp8_dot_product_attention": fp8_dpa(c, unresolved),
            "pipeline_model_parallel_layout": pp_layout(g(c, "model.pipeline_model_parallel_layout")),
            "recipe_defaults": sorted(set(unresolved)),
            "provenance": {"tag": tag if tag != "HEAD" else "067f987d", "file": r["file"], "config": config},
        }
        for k in ("cuda_graph_scope", "recompute_modules", "offload_modules"):
            if isinstance(row[k], str): row[k] = [row[k]]  # MCore accepts one scope name as a string
        if row["moe_token_dispatcher_type"] is None:
            value, path = provider_dispatcher(tag, model)
            if value is not None:
                row["moe_token_dispatcher_type"] = value
                row["recipe_defaults"].remove("moe_token_dispatcher_type")
                row["provider_defaults"] = [f"moe_token_dispatcher_type ({path})"]
        row.setdefault("provider_defaults", [])
        row["provenance"] = row.pop("provenance")
        rows.append(row)

# 25.09 = v0.1.0rc4: perf_matrix YAML + the model branches of scripts/performance/run_script.py main()
RS = "scripts/performance/run_script.py"
for yf in sorted(glob.glob("/tmp/mb/v0.1.0rc4/scripts/performance/configs/*/*_llm_pretrain.yaml")):
    model = os.path.basename(yf)[:-len("_llm_pretrain.yaml")]
    if DENSE.match(model): continue
    y = yaml.safe_load(open(yf)); base_model = y["ConfigContainer"]["model"]
    for gpu, by_n in y["perf_matrix"].items():
        for nkey, ent in by_n.items():
            com = ent["common"]
            for prec in [p for p in ent if p != "common"]:
                o = dict(com); o.update(ent[prec] or {})
                unresolved = []
                if model == "deepseek_v3":
                    deepep = gpu == "h100"; tokendrop = gpu in ("b200", "gb200")
                    if tokendrop: deepep = False
                    a2a = gpu == "h100"
                    rec = {"h100": ["mla_up_proj", "mlp"], "b200": ["mla_up_proj"], "gb200": ["mla_up_proj"] if tokendrop else ["mla_up_proj", "mlp"]}.get(gpu)
                    if rec is None: unresolved.append("recompute_modules")
                    dt = "flex" if deepep else None
                    if not deepep: unresolved.append("moe_token_dispatcher_type")
                    shared = not a2a
                else:
                    tokendrop = True; deepep = False; a2a = False; rec = None; dt = None; shared = None
                    unresolved += ["moe_token_dispatcher_type", "moe_shared_expert_overlap", "recompute_modules"]
                unresolved += ["moe_permute_fusion"]
                rows.append({
                    "release": "25.09", "model": model, "gpu": gpu, "precision": PREC[prec], "variant": "default",
                    "num_gpus": int(nkey.split("_")[-1]), "tp": o["tp"], "pp": o["pp"], "vp": o.get("vp"), "cp": o["cp"],
                    "ep": o["ep"], "etp": o.get("etp"), "mbs": o["mbs"], "gbs": o["gbs"], "seq_len": o["seq_length"],
                    "moe_token_dispatcher_type": dt, "moe_flex_dispatcher_backend": "deepep" if deepep else None,
                    "moe_a2a_overlap": a2a, "delay_wgrad_compute": a2a, "moe_shared_expert_overlap": shared,
                    "cuda_graph_impl": ("local" if o.get("cuda_graphs") else "none"), "cuda_graph_scope": None,
                    "recompute_granularity": base_model.get("recompute_granularity"), "recompute_modules": rec,
                    "recompute_num_layers": o.get("recompute_num_layers"),
                    # apply_moe_token_drop() defaults: capacity factor 1.0, pad to capacity True
                    "moe_pad_expert_input_to_capacity": True if tokendrop else None,
                    "moe_expert_capacity_factor": 1.0 if tokendrop else None,
                    "moe_expert_rank_capacity_factor": None, "moe_permute_fusion": None,
                    "moe_router_fusion": base_model.get("moe_router_fusion"), "cpu_offloading_num_layers": None,
                    "offload_modules": None, "use_megatron_fsdp": bool(o.get("use_megatron_fsdp")),
                    "fp8_dot_product_attention": None,
                    "pipeline_model_parallel_layout": None,
                    "recipe_defaults": sorted(set(unresolved + ["fp8_dot_product_attention"])),
                    "provider_defaults": [],
                    "provenance": {"tag": "v0.1.0rc4", "file": f"scripts/performance/configs/{os.path.basename(os.path.dirname(yf))}/{os.path.basename(yf)}",
                                   "config": f"perf_matrix.{gpu}.{nkey}.{prec} + {RS}:main() {model} branch"},
                })
for row in rows:
    if row["release"] == "25.09" and row["moe_token_dispatcher_type"] is None:
        value, path = provider_dispatcher("v0.1.0rc4", row["model"])
        if value is not None:
            row["moe_token_dispatcher_type"] = value
            row["recipe_defaults"].remove("moe_token_dispatcher_type")
            row["provider_defaults"] = [f"moe_token_dispatcher_type ({path})"]
# Fields no perf/recipe code wrote: the model-provider files at the tag, else Megatron-Core's
# TransformerConfig default at the Megatron-LM commit the tag pins (3rdparty/Megatron-LM).
FAMDIRS = [("deepseek", ["deepseek"]), ("kimi", ["kimi", "deepseek"]), ("qwen3_vl", ["qwen_vl", "qwen"]),
           ("qwen35_vl", ["qwen_vl", "qwen"]), ("qwen3", ["qwen"]), ("gpt_oss", ["gpt_oss"]),
           ("nemotron_3", ["nemotronh", "mamba"])]
SIMPLE = ("cuda_graph_impl", "moe_permute_fusion", "moe_shared_expert_overlap", "moe_router_fusion")
MLM = os.environ.get("MLM", "/work/.mirror/NVIDIA+Megatron-LM/repo")
TAGREF = {v: k for k, v in TAGS.items()}
_grep = {}
def provider_value(tag, model, field):
    dirs = next((d for p, d in FAMDIRS if model.startswith(p)), None)
    if dirs is None: return None, None
    key = (tag, tuple(dirs), field)
    if key in _grep: return _grep[key]
    paths = [f"src/megatron/bridge/models/{d}" for d in dirs] + ["src/megatron/bridge/models/gpt_provider.py",
             "src/megatron/bridge/models/model_provider.py", "src/megatron/bridge/models/transformer_config.py"]
    out = subprocess.run(["git", "-C", MIRROR, "grep", "-h", "-E", rf"\b{field}\b\s*(:[^=]*)?=[^=]", tag, "--", *paths],
                         capture_output=True, text=True).stdout
    vals = set()
    for line in out.splitlines():
        m = re.search(rf"\b{field}\b\s*(?::[^=]*)?=\s*([^,#)]+)", line)
        vals.add(m.group(1).strip() if m else line)
    res = (None, None)
    if not vals:
        sub = subprocess.run(["git", "-C", MIRROR, "ls-tree", tag, "3rdparty/Megatron-LM"], capture_output=True, text=True).stdout.split()
        if len(sub) >= 3:
            text = subprocess.run(["git", "-C", MLM, "show", f"{sub[2]}:megatron/core/transformer/transformer_config.py"],
                                  capture_output=True, text=True).stdout
            m = re.search(rf"^    {field}: [^=]+= (.+)$", text, re.M)
            if m:
                res = (yaml.safe_load(m.group(1).strip()), f"Megatron-LM@{sub[2][:8]} megatron/core/transformer/transformer_config.py")
    elif len(vals) == 1:
        v = vals.pop()
        try:
            lit = yaml.safe_load(v.replace("True", "true").replace("False", "false"))
        except Exception:
            lit = None
        ok = lit in ("none", "local", "transformer_engine", "full_iteration") if field == "cuda_graph_impl" else isinstance(lit, bool)
        if ok:  # a literal of the field's kind, never an expression such as is_te_min_version(...)
            res = (lit, "src/megatron/bridge/models/" + ",".join(dirs))
    _grep[key] = res
    return res
for row in rows:
    tag = row["provenance"]["tag"]; tag = "HEAD" if tag == "067f987d" else tag
    for f in SIMPLE:
        if f in row["recipe_defaults"]:
            v, src = provider_value(tag, row["model"], f)
            if v is not None:
                row[f] = v
                row["recipe_defaults"].remove(f)
                row["provider_defaults"].append(f"{f} ({src})")
print(len(rows))
import collections
print(collections.Counter(r["release"] for r in rows))
COLUMNS = [k for k in rows[0] if k != "provenance"] + ["provenance_tag", "provenance_file", "provenance_config"]
def flat(r):
    return [r[k] for k in COLUMNS[:-3]] + [r["provenance"]["tag"], r["provenance"]["file"], r["provenance"]["config"]]
hdr = ("# Megatron-Bridge MoE pre-training perf configs, one row per (release, model, gpu, precision, variant, num_gpus).\n"
       "# Generated by tools/mbridge_recipes (harness.py runs each tag's scripts/performance or perf_recipes config\n"
       "# functions, and the library recipes they call, with stubbed imports, recording every cfg write; build.py\n"
       "# writes this file). Values are the effective ones after the perf helpers. recipe_defaults lists fields the\n"
       "# code leaves to a model-provider class default (value null here: not resolved, never guessed).\n"
       "# Releases and tags: docs/moe-training.md 'Recipe settings by release'.\n")
def dump(v): return yaml.safe_dump(v, default_flow_style=True, width=100000).strip()
lines = [hdr, "columns: " + dump(COLUMNS), "rows:"]
lines += ["- " + dump(flat(r)) for r in rows]
open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src", "zrt_core", "data",
               "recipes", "megatron_bridge.yaml"), "w").write("\n".join(lines) + "\n")
