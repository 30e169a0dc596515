"""Execute Megatron-Bridge perf-config code at one tag with stubbed heavy imports; record cfg writes."""
import sys, os, types, importlib, importlib.util, importlib.abc, json, re, traceback, inspect, glob

TAG = sys.argv[1]; GPU = sys.argv[2]; OUT = sys.argv[3]
ROOT = f"/tmp/mb/{TAG}"
SRC = f"{ROOT}/src"
GPU_PROPS = {"h100": (9, "NVIDIA H100 80GB HBM3"), "b200": (10, "NVIDIA B200"), "b300": (10, "NVIDIA B300 SXM6 AC"),
             "gb200": (10, "NVIDIA GB200"), "gb300": (10, "NVIDIA GB300")}

class Rec:
    def __init__(self, path="", init=None):
        object.__setattr__(self, "_p", path); object.__setattr__(self, "_d", {})
        for k, v in (init or {}).items():
            self._d[k] = v
    def __getattr__(self, k):
        if k.startswith("__"): raise AttributeError(k)
        d = object.__getattribute__(self, "_d")
        if k not in d: d[k] = Rec(f"{self._p}.{k}")
        return d[k]
    def __setattr__(self, k, v): self._d[k] = v
    def __call__(self, *a, **kw): return Rec(self._p + "()", kw)
    def __bool__(self): return False
    def __iter__(self): return iter([])
    def __eq__(self, o): return isinstance(o, Rec) and o is self
    def __hash__(self): return id(self)
    def __repr__(self): return f"<unset {self._p}>"
    def __getitem__(self, k): return Rec(f"{self._p}[{k}]")
    def __setitem__(self, k, v): pass
    def __contains__(self, k): return False
    def __len__(self): return 0
    def items(self): return []
    def __or__(self, o): return self
    def __ror__(self, o): return self
    def __mro_entries__(self, bases): return (Rec,)
    def get(self, k, d=None): return self._d.get(k, d) if not isinstance(self._d.get(k, d), Rec) else d

class StubMod(types.ModuleType):
    def __init__(self, name):
        super().__init__(name); self.__path__ = []; self.__all__ = []
    def __getattr__(self, k):
        if k.startswith("__"): raise AttributeError(k)
        if k[:1].isupper() and not k.isupper():
            # a class: subclassable and callable (instances record kwargs)
            class _Meta(type):
                def __getattr__(c, a):
                    if a.startswith("__"): raise AttributeError(a)
                    return Rec(f"{k}.{a}")
                def __getitem__(c, a): return c
            cls = _Meta(k, (Rec,), {})
            def new(c, *a, **kw): return Rec(k, kw)
            cls.__new__ = new
            import dataclasses; cls = dataclasses.dataclass(cls)
            setattr(self, k, cls); return cls
        r = Rec(f"{self.__name__}.{k}"); setattr(self, k, r); return r

REAL = ("megatron.bridge.perf_recipes", *(("megatron.bridge.recipes",) if os.environ.get("LIB") else ()), "megatron.bridge.training.flex_dispatcher_backend",
        "megatron.bridge.training.utils.moe_token_drop")

class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top not in ("megatron", "torch", "nemo_run", "omegaconf", "transformer_engine", "transformers", "nemo", "modelopt", "numpy", "yaml", "hydra", "PIL", "qwen_vl_utils", "datasets", "accelerate", "einops", "safetensors"):
            return None
        rel = name.replace(".", "/")
        if any(name == r or name.startswith(r + ".") for r in REAL):
            f = f"{SRC}/{rel}.py"
            if os.path.isfile(f):
                return importlib.util.spec_from_file_location(name, f)
            if os.path.isdir(f"{SRC}/{rel}"):
                # package: do not run its __init__ (it imports every recipe); resolve submodules from disk
                spec = importlib.util.spec_from_loader(name, self, is_package=True)
                spec.submodule_search_locations = [f"{SRC}/{rel}"]
                return spec
        return importlib.util.spec_from_loader(name, self, is_package=True)
    def create_module(self, spec):
        m = StubMod(spec.name)
        if spec.submodule_search_locations: m.__path__ = list(spec.submodule_search_locations)
        if spec.name == "torch":
            maj, nm = GPU_PROPS[GPU]
            m.cuda = types.SimpleNamespace(get_device_properties=lambda i: types.SimpleNamespace(major=maj, minor=0, name=nm),
                                           is_available=lambda: True, device_count=lambda: 8)
        return m
    def exec_module(self, m): pass

sys.meta_path.insert(0, Finder())
sys.path.insert(0, f"{ROOT}/scripts/performance")
import logging; logging.disable(logging.CRITICAL)
import builtins; builtins.input = lambda *a: ""

KEYS_MODEL = ["tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
    "context_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size", "sequence_parallel", "seq_length",
    "moe_token_dispatcher_type", "moe_flex_dispatcher_backend", "moe_shared_expert_overlap", "cuda_graph_impl",
    "cuda_graph_scope", "enable_cuda_graph", "recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules",
    "moe_pad_expert_input_to_capacity", "moe_expert_capacity_factor", "moe_expert_rank_capacity_factor",
    "moe_permute_fusion", "moe_router_fusion", "cpu_offloading", "cpu_offloading_num_layers",
    "fine_grained_activation_offloading", "offload_modules", "moe_router_force_load_balancing", "pipeline_model_parallel_layout",
    "moe_paged_stash", "moe_hybridep_num_sms"]

def plain(v):
    if isinstance(v, Rec): return "__unset__"
    if isinstance(v, (list, tuple)): return [plain(x) for x in v]
    if isinstance(v, (str, int, float, bool)) or v is None: return v
    return repr(v)

def snapshot(cfg):
    out = {}
    m = cfg._d.get("model"); t = cfg._d.get("train"); co = cfg._d.get("comm_overlap"); mp = cfg._d.get("mixed_precision"); ds = cfg._d.get("dataset"); ddp = cfg._d.get("ddp")
    for k in KEYS_MODEL:
        if isinstance(m, Rec) and k in m._d: out["model." + k] = plain(m._d[k])
    for obj, pre, ks in ((t, "train.", ["global_batch_size", "micro_batch_size"]),
                         (co, "comm_overlap.", ["overlap_moe_expert_parallel_comm", "delay_wgrad_compute"]),
                         (ds, "dataset.", ["sequence_length", "seq_length"]),
                         (ddp, "ddp.", ["use_megatron_fsdp"])):
        if isinstance(obj, Rec):
            for k in ks:
                if k in obj._d: out[pre + k] = plain(obj._d[k])
    if isinstance(mp, Rec):
        out["mixed_precision"] = repr(mp._p) + " " + json.dumps({k: plain(v) for k, v in mp._d.items()}, default=str)[:300]
    elif mp is not None:
        out["mixed_precision"] = plain(mp)
    return out

results = []
used = {}
GPUS = ("h100", "b200", "b300", "gb200", "gb300")
if os.path.isdir(f"{SRC}/megatron/bridge/perf_recipes"):
    for f in sorted(glob.glob(f"{SRC}/megatron/bridge/perf_recipes/*/{GPU}/*.py")):
        fam = f.split("/")[-3]; stem = os.path.basename(f)[:-3]
        modname = f"megatron.bridge.perf_recipes.{fam}.{GPU}.{stem}"
        try:
            mod = importlib.import_module(modname)
        except Exception as e:
            results.append({"file": f, "error": f"import: {e!r}"}); continue
        for fname, fn in inspect.getmembers(mod, inspect.isfunction):
            if fn.__module__ != modname or fname.startswith("_") or "pretrain" not in fname: continue
            try:
                cfg = fn()
                results.append({"file": f[len(ROOT) + 1:], "func": fname, "cfg": snapshot(cfg)})
            except Exception as e:
                results.append({"file": f[len(ROOT) + 1:], "func": fname, "error": repr(e), "tb": traceback.format_exc()[-600:]})
else:
    import utils.utils as uu
    orig = uu.get_workload_base_config
    def spy(*a, **kw):
        r = orig(*a, **kw)
        if isinstance(r, uu.WorkloadBaseConfig):
            mod = importlib.import_module(f"configs.{kw.get('model_family_name', kw.get('model_name', a[0] if a else ''))}")
            names = [n for n in dir(mod) if getattr(mod, n) is r]
            # also look in submodules
            used["name"] = names; used["base"] = {k: plain(v) for k, v in vars(r).items()}
        return r
    uu.get_workload_base_config = spy
    for f in sorted(glob.glob(f"{ROOT}/scripts/performance/configs/*/*pretrain*.py")):
        fam = f.split("/")[-2]; stem = os.path.basename(f)[:-3]
        try:
            mod = importlib.import_module(f"configs.{fam}.{stem}")
        except Exception as e:
            results.append({"file": f, "error": f"import: {e!r}", "tb": traceback.format_exc()[-800:]}); continue
        g = vars(mod)
        g["get_workload_base_config"] = spy
        if "set_workload_base_configs" in g and not getattr(g["set_workload_base_configs"], "_spy", False):
            orig_set = g["set_workload_base_configs"]
            def set_spy(cfg, settings, *a, _o=orig_set, _fam=fam, **kw):
                if not used.get("name"):
                    names = []
                    for wm in [m for k, m in sys.modules.items() if k.startswith(f"configs.{_fam}")]:
                        names += [n for n in dir(wm) if getattr(wm, n) is settings and n.isupper()]
                    used["name"] = sorted(set(names)); used["base"] = {k: plain(v) for k, v in vars(settings).items()}
                return _o(cfg, settings, *a, **kw)
            set_spy._spy = True
            g["set_workload_base_configs"] = set_spy
        for fname, fn in inspect.getmembers(mod, inspect.isfunction):
            if fn.__module__ != mod.__name__ or not re.search(rf"_{GPU}(_|$)", fname): continue
            params = inspect.signature(fn).parameters
            for prec in ("bf16", "fp8_cs", "fp8_mx", "nvfp4", "fp8_ss", "fp8"):
                variants = ["v1", "v2", "v3"] if "config_variant" in params else [None]
                for var in variants:
                    used.clear()
                    kw = {"precision": prec}
                    if var: kw["config_variant"] = var
                    if "mock" in params: kw["mock"] = True
                    try:
                        cfg = fn(**kw)
                    except Exception as e:
                        continue
                    if not used.get("name"): continue
                    results.append({"file": f[len(ROOT) + 1:], "func": fname, "precision": prec, "variant": var,
                                    "base_names": used["name"], "base": used["base"], "cfg": snapshot(cfg)})
json.dump(results, open(OUT, "w"), indent=1, default=str)
print(TAG, GPU, len(results), sum(1 for r in results if "error" in r))
