"""The analytic front-end: the operator graphs of a model from its numbers alone.

:func:`analytic_capture` returns what :func:`zrt_core.capture` returns — a
:class:`~zrt_core.capture.api.CaptureResult` with one :class:`~zrt_core.ir.graph.OpGraph` per
phase — without torch or transformers: the models below call the aten operators that
HuggingFace's modeling code dispatches, with the module paths, classes and parameter names it
uses, through :mod:`zrt_core.analytic.aten` (forward and backward on shapes). The graphs
follow the capture's conventions (docs/architecture.md): one decoder layer per kind with a
:class:`~zrt_core.ir.graph.LayerTemplate`, ``zrt.attention`` per layer with ``is_causal``,
``window``, ``chunk``, ``scale``, ``softcap``; MoE layers as router → ``zrt.moe_dispatch``
→ ``aten._grouped_mm`` (``group_rows`` under the routing assumption) → ``zrt.moe_combine``;
the KV cache as a ``cat`` of the cached and the new rows in decode; training with
``seq_nr``/``fwd_seq_nr``, saved activations shared by tensor id, and the loss. Every
transform, cost backend, scheduler and estimator therefore works on them unchanged.

Families: ``llama``, ``mistral``, ``qwen2``, ``qwen3`` (dense, grouped-query attention,
RMSNorm, SwiGLU, rotary; sliding windows where the config has them), ``mixtral`` and
``qwen3_moe`` (routed experts), ``gpt2`` (LayerNorm, fused QKV ``Conv1D``, GELU, learned
positions, dropout in training). Anything else is a :class:`~zrt_core.errors.ModelError`
naming the family; the capture front-end covers every family transformers can build.

Where the two front-ends differ (tests hold the totals to each other within 2%): nothing
below the operator level is modelled differently, but the analytic graph omits operators a
family's code runs that cost nothing measurable (mask bookkeeping that the capture's patches
already remove), and HuggingFace corner cases (checkpoint-specific rope scaling kernels,
attention biases on exotic variants) follow the family default.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from zrt_core.analytic import aten
from zrt_core.analytic.trace import T, Tracer
from zrt_core.errors import ModelError
from zrt_core.ir.graph import LayerTemplate, Phase
from zrt_core.modelinfo import ModelDims, text_config

if TYPE_CHECKING:
    from zrt_core.capture.api import CaptureResult
    from zrt_core.plugins import PluginHost

INT64_MAX = aten.INT64_MAX
F32 = "float32"
I64 = "int64"

#: model_type → (class-name prefix, family shape). ``llama`` shape: RMSNorm, rotary,
#: q/k/v/o projections, SwiGLU MLP (or routed experts).
FAMILIES: dict[str, tuple[str, str]] = {
    "llama": ("Llama", "llama"),
    "mistral": ("Mistral", "llama"),
    "qwen2": ("Qwen2", "llama"),
    "qwen3": ("Qwen3", "llama"),
    "mixtral": ("Mixtral", "llama"),
    "qwen3_moe": ("Qwen3Moe", "llama"),
    "gpt2": ("GPT2", "gpt2"),
}
#: What transformers' config classes (5.x) fill in for keys a config leaves out, where it
#: changes what the model computes: the capture's ``config`` carries these defaults, and
#: the estimators read some (``attn_pdrop`` for Megatron's unfused attention dropout).
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
              "tie_word_embeddings": False, "attention_bias": False,
              "attention_dropout": 0.0, "mlp_bias": False},
    "mistral": {"hidden_act": "silu", "max_position_embeddings": 131072,
                "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "sliding_window": 4096,
                "attention_dropout": 0.0, "num_key_value_heads": 8},
    "qwen2": {"hidden_act": "silu", "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
              "tie_word_embeddings": False, "use_sliding_window": False,
              "sliding_window": None, "max_window_layers": 28, "attention_dropout": 0.0},
    "qwen3": {"hidden_act": "silu", "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
              "head_dim": 128, "tie_word_embeddings": False, "attention_bias": False,
              "use_sliding_window": False, "sliding_window": None, "max_window_layers": 28,
              "attention_dropout": 0.0},
    "mixtral": {"hidden_act": "silu", "max_position_embeddings": 131072,
                "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "sliding_window": None,
                "attention_dropout": 0.0, "num_key_value_heads": 8,
                "router_jitter_noise": 0.0},
    "qwen3_moe": {"hidden_act": "silu", "max_position_embeddings": 32768,
                  "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
                  "attention_bias": False, "use_sliding_window": False,
                  "sliding_window": None, "attention_dropout": 0.0,
                  "decoder_sparse_step": 1, "norm_topk_prob": False, "mlp_only_layers": [],
                  "num_key_value_heads": 4},
    "gpt2": {"n_positions": 1024, "activation_function": "gelu_new", "resid_pdrop": 0.1,
             "embd_pdrop": 0.1, "attn_pdrop": 0.1, "layer_norm_epsilon": 1e-5,
             "scale_attn_weights": True, "tie_word_embeddings": True},
}
#: The one activation each family's analytic model computes.
_ACTIVATION = {"gpt2": ("activation_function", "gelu_new")}
_QK_NORM = frozenset({"qwen3", "qwen3_moe"})
_QKV_BIAS = frozenset({"qwen2"})
_DTYPES = ("bfloat16", "float16", "float32")


def supported(model_type: str) -> bool:
    """Whether the analytic front-end builds graphs for ``model_type``."""
    return model_type in FAMILIES


def analytic_capture(
    model: Any,
    phases: Iterable[str] | str = Phase.CAPTURED,
    batch: int = 1,
    seq_len: int = 2048,
    *,
    host: PluginHost | None = None,
    dtype: str = "bfloat16",
    moe_imbalance: float = 1.0,
    last_token_logits: bool = True,
) -> CaptureResult:
    """The graphs of ``phases`` built from the model's numbers (see the module docstring).

    :param model: a config mapping (HuggingFace ``config.json`` keys), a bundled name or a
        config path (read offline, never built).
    :param phases: any of ``prefill``, ``decode``, ``train_forward``, ``train_backward``.
    :param batch: sequences per step; ``seq_len`` tokens each (decode: cached tokens).
    :param dtype: ``bfloat16``, ``float16`` or ``float32``.
    :param moe_imbalance: busiest expert's load over the mean (1.0: balanced routing).
    :raises ModelError: an unsupported family, a missing field or a bad option.
    """
    from zrt_core.capture.api import CaptureResult, FlopsCheck
    from zrt_core.capture.graphs import build_graph
    from zrt_core.capture.options import CaptureOptions

    start = time.perf_counter()
    options = CaptureOptions(phases=phases, batch=batch, seq_len=seq_len,
                             moe_imbalance=moe_imbalance, dtype=dtype,
                             last_token_logits=last_token_logits)
    if dtype not in _DTYPES:
        raise ModelError(f"unsupported dtype {dtype!r}", f"use one of {', '.join(_DTYPES)}")
    name, source, config = _resolve(model, host)
    cfg = dict(text_config(config))
    model_type = str(cfg.get("model_type") or config.get("model_type") or "")
    if model_type not in FAMILIES:
        raise ModelError(
            f"the analytic front-end has no model of model_type {model_type!r}",
            f"it builds {', '.join(sorted(FAMILIES))}; use the capture front-end "
            "(--frontend capture) for other families")
    from zrt_core.capture.sources import check_capture_request

    check_capture_request(config, options.phases, seq_len, host)
    cfg = {**FAMILY_DEFAULTS[model_type], **cfg}
    key, value = _ACTIVATION.get(model_type, ("hidden_act", "silu"))
    if str(cfg.get(key) or value) != value:
        raise ModelError(f"the analytic {model_type} model computes {key}={value!r}, the "
                         f"config asks for {cfg.get(key)!r}",
                         "use the capture front-end (--frontend capture)")
    dims = ModelDims.from_config(cfg)
    spec = _Model.for_config(cfg, dims, model_type)
    templates = spec.templates()
    tracer = Tracer(dtype)
    tracer.set_layer_rule(spec.layer_of)
    warnings: list[str] = []
    ordered = [p for p in Phase.CAPTURED if p in options.phases]
    meta_base = {
        "model": name, "model_type": model_type, "source": source, "frontend": "analytic",
        "batch": batch, "seq_len": seq_len, "dtype": dtype, "full_depth": False,
        "moe_imbalance": moe_imbalance, "num_layers": dims.layers,
        "logits_positions": 1 if last_token_logits else seq_len,
    }
    run = _Run(tracer, spec, batch, seq_len, moe_imbalance, last_token_logits)
    if Phase.PREFILL in ordered or Phase.DECODE in ordered:
        run.prefill(record=Phase.PREFILL in ordered)
        if Phase.DECODE in ordered:
            run.decode()
    if Phase.TRAIN_FORWARD in ordered or Phase.TRAIN_BACKWARD in ordered:
        loss = run.train_forward()
        if Phase.TRAIN_BACKWARD in ordered:
            tracer.start_backward(Phase.TRAIN_BACKWARD)
            tracer.backward(loss)
    registry = (host.formulas if host is not None else _default_formulas())
    graphs = {}
    for phase in ordered:
        meta = dict(meta_base)
        if phase == Phase.DECODE:
            meta["kv_len"] = seq_len
        if phase.startswith("train"):
            meta["logits_positions"] = seq_len
        graphs[phase] = build_graph(phase, tracer.ops.get(phase, []), registry, templates,
                                    meta, warnings)
    counts = spec.param_counts()
    checks = {}
    from zrt_core.modelmath import flops as reference

    for phase, g in graphs.items():
        ref = reference.phase_flops(cfg, phase, batch, seq_len)
        checks[phase] = FlopsCheck(phase=phase, captured=g.totals().flops, analytic=ref.total)
    return CaptureResult(
        model=name, model_type=model_type, source=f"analytic: {source}", options=options,
        graphs=graphs, params=counts, dims=dims, templates=templates,
        timings_s={"build": time.perf_counter() - start}, flops_checks=checks,
        warnings=warnings, config=cfg)


def _default_formulas() -> Any:
    from zrt_core.plugins import get_plugin_manager

    return get_plugin_manager(autoload=False).formulas


def _resolve(model: Any, host: PluginHost | None) -> tuple[str, str, dict[str, Any]]:
    from zrt_core.capture.sources import resolve_model

    if isinstance(model, Mapping):
        cfg = dict(model)
        return str(cfg.get("_name_or_path") or "config"), "mapping", cfg
    resolved = resolve_model(model, host, check_model_type=False)
    return resolved.name, resolved.source, dict(resolved.config)


# -- the model description -----------------------------------------------------------------


class _Model:
    """Names, shapes and layer kinds of one supported model (HF's module tree)."""

    def __init__(self, cfg: dict[str, Any], dims: ModelDims, model_type: str) -> None:
        self.cfg = cfg
        self.d = dims
        self.model_type = model_type
        self.prefix, self.shape = FAMILIES[model_type]
        if self.shape == "gpt2":
            self.root, self.layers_path = "transformer", "transformer.h"
        else:
            self.root, self.layers_path = "model", "model.layers"
        self.kinds = self._layer_kinds()

    @classmethod
    def for_config(cls, cfg: dict[str, Any], dims: ModelDims, model_type: str) -> _Model:
        return cls(cfg, dims, model_type)

    def layer_of(self, path: str) -> int | None:
        head = self.layers_path + "."
        if not path.startswith(head):
            return None
        index = path[len(head):].split(".", 1)[0]
        return int(index) if index.isdigit() else None

    # -- layer kinds -------------------------------------------------------------------------

    def _moe_layers(self) -> set[int]:
        d, cfg = self.d, self.cfg
        if not d.experts:
            return set()
        mlp_only = set(cfg.get("mlp_only_layers") or ())
        step = int(cfg.get("decoder_sparse_step") or 1)
        return {i for i in range(d.layers) if i not in mlp_only and (i + 1) % step == 0}

    def _windows(self) -> list[int]:
        """Sliding window per layer (0: full attention), as each family's config sets it."""
        from zrt_core.modelmath.arch import _attention_types

        if self.shape == "gpt2":
            return [0] * self.d.layers
        types = _attention_types(self.d, self.cfg, self.model_type)
        window = int(self.cfg.get("sliding_window") or 0)
        return [window if t == "sliding_attention" else 0 for t in types]

    def _layer_kinds(self) -> list[tuple[str, tuple[int, ...], bool, int]]:
        """``(kind, indices, moe, window)`` in order of first appearance, named as the
        capture names them (``dense``/``moe``; attention types when they vary)."""
        moe = self._moe_layers()
        windows = self._windows()
        layer_types = self.cfg.get("layer_types")
        groups: dict[tuple[bool, int], list[int]] = {}
        for i in range(self.d.layers):
            groups.setdefault((i in moe, windows[i]), []).append(i)
        att_vary = len({w for _, w in groups}) > 1
        ffn_vary = len({m for m, _ in groups}) > 1
        out = []
        for (is_moe, window), indices in groups.items():
            ffn = "moe" if is_moe else "dense"
            if len(groups) == 1:
                name = ffn
            else:
                parts = []
                if att_vary:
                    if isinstance(layer_types, list | tuple) and len(layer_types) > indices[0]:
                        parts.append(str(layer_types[indices[0]]))
                    else:
                        parts.append("sliding_attention" if window else "full_attention")
                if ffn_vary:
                    parts.append(ffn)
                name = "+".join(parts) or "layer"
            out.append((name, tuple(indices), is_moe, window))
        return out

    def templates(self) -> tuple[LayerTemplate, ...]:
        return tuple(LayerTemplate(kind=k, representative=idx[0], indices=idx)
                     for k, idx, _, _ in self.kinds)

    # -- parameters ----------------------------------------------------------------------

    def param_counts(self) -> Any:
        """Total and per-token active parameters of the model as the capture counts them
        (every parameter of the built model; routed experts ``top_k/E`` of theirs)."""
        from zrt_core.capture.build import ParamCounts
        from zrt_core.modelmath.arch import architecture
        from zrt_core.modelmath.flops import param_counts

        arch = architecture(self.cfg)
        counts = param_counts(arch)
        routed = sum(layer.expert_params for layer in arch.layers)
        return ParamCounts(total=counts.total, active=counts.active, routed_experts=routed)


# -- one capture session -------------------------------------------------------------------


class _Run:
    """The phases of one analytic capture, in the capture's order, sharing tensor ids."""

    def __init__(self, tr: Tracer, m: _Model, batch: int, seq_len: int, imbalance: float,
                 last_token_logits: bool) -> None:
        self.tr = tr
        self.m = m
        self.batch = batch
        self.seq = seq_len
        self.imbalance = imbalance
        self.last_token = last_token_logits
        self.caches: dict[int, tuple[T, T]] = {}
        self.inv_freq: T | None = None
        self.training = False

    # -- phases --------------------------------------------------------------------------

    def prefill(self, *, record: bool) -> None:
        self.tr.start_phase(Phase.PREFILL if record else "_prefill_unrecorded", grad=False)
        self.training = False
        self._forward(self.seq, cache_len=0, logits=1 if self.last_token else self.seq)

    def decode(self) -> None:
        self.tr.start_phase(Phase.DECODE, grad=False)
        self.training = False
        self._forward(1, cache_len=self.seq, logits=1)

    def train_forward(self) -> T:
        self.tr.start_phase(Phase.TRAIN_FORWARD, grad=True)
        self.training = True
        return self._forward(self.seq, cache_len=0, logits=self.seq, train=True)

    def _forward(self, s: int, *, cache_len: int, logits: int, train: bool = False) -> T:
        if self.m.shape == "gpt2":
            return _gpt2_forward(self, s, cache_len, logits, train)
        return _llama_forward(self, s, cache_len, logits, train)

    # -- shared pieces ----------------------------------------------------------------------

    def linear(self, path: str, x: T, out_features: int, *, bias: bool = False) -> T:
        """``nn.Linear`` on ``[..., K]``: ``t(W)``, a view to 2-D, ``mm`` (``addmm`` with a
        bias), ``_unsafe_view`` back (``view`` for 2-D inputs)."""
        tr = self.tr
        k = x.shape[-1]
        with tr.module(path, "Linear"):
            w = tr.param(f"{path}.weight", (out_features, k))
            b = tr.param(f"{path}.bias", (out_features,)) if bias else None
            lead = x.shape[:-1]
            rows = math.prod(lead)
            if b is None:
                wt = aten.t(tr, w)
                x2 = aten.view(tr, x, (rows, k)) if len(x.shape) != 2 else x
                y = aten.mm(tr, x2, wt)
            else:  # torch's linear folds a 3-D input first, then addmm
                x2 = aten.view(tr, x, (rows, k)) if len(x.shape) != 2 else x
                wt = aten.t(tr, w)
                y = aten.addmm(tr, b, x2, wt)
            if len(x.shape) != 2:
                y = aten.unsafe_view(tr, y, (*lead, out_features)) if b is None else \
                    aten.view(tr, y, (*lead, out_features))
        return y

    def conv1d(self, path: str, x: T, out_features: int) -> T:
        """GPT-2's ``Conv1D``: ``view(-1, K)``, ``addmm(bias, x, W[K, N])``, ``view`` back."""
        tr = self.tr
        k = x.shape[-1]
        with tr.module(path, "Conv1D"):
            w = tr.param(f"{path}.weight", (k, out_features))
            b = tr.param(f"{path}.bias", (out_features,))
            lead = x.shape[:-1]
            x2 = aten.view(tr, x, (math.prod(lead), k), size=(-1, k))
            y = aten.addmm(tr, b, x2, w)
            y = aten.view(tr, y, (*lead, out_features))
        return y

    def rms_norm(self, path: str, cls: str, x: T, width: int | None = None) -> T:
        """HF RMSNorm: fp32 upcast, pow 2, mean, + eps, rsqrt, scale, downcast, weight."""
        tr = self.tr
        width = width or x.shape[-1]
        with tr.module(path, cls):
            w = tr.param(f"{path}.weight", (width,))
            h = aten.to_copy(tr, x, F32)
            v = aten.mean_last(tr, aten.pow_(tr, h, 2))
            r = aten.rsqrt(tr, aten.add_scalar(tr, v))
            h = aten.mul(tr, h, r)
            h = aten.to_copy(tr, h, x.dtype)
            return aten.mul(tr, w, h)

    def positions(self, s: int, cache_len: int) -> T:
        """``cache_position = arange(s) + past``; ``position_ids = unsqueeze(0)``."""
        tr = self.tr
        ar = tr.tensor((s,), I64)
        tr.record("aten.arange", [], [ar], {"end": s, "pin_memory": False})
        pos = tr.tensor((s,), I64)
        tr.record("aten.add", [ar], [pos], {})
        return aten.unsqueeze(tr, pos, 0)

    def rotary(self, pos: T, head_dim: int) -> tuple[T, T]:
        """``LlamaRotaryEmbedding``: cos and sin ``[1, s, head_dim]`` in the model dtype."""
        tr = self.tr
        m = self.m
        with tr.module(f"{m.root}.rotary_emb", f"{m.prefix}RotaryEmbedding"):
            if self.inv_freq is None:
                self.inv_freq = tr.buffer((head_dim // 2,), F32)
            p = aten.unsqueeze(tr, pos, 2)
            p = aten.to_copy(tr, p, F32)
            freqs = tr.tensor((1, pos.shape[1], head_dim // 2), F32)
            tr.record("aten.mul", [p, self.inv_freq], [freqs], {})
            emb = tr.tensor((1, pos.shape[1], head_dim), F32)
            tr.record("aten.cat", [freqs, freqs], [emb], {"dim": -1})
            out = []
            for trig in ("cos", "sin"):
                c = tr.like(emb)
                tr.record(f"aten.{trig}", [emb], [c], {})
                c2 = tr.like(c)
                tr.record("aten.mul", [c], [c2], {})
                out.append(c2)
            cos = aten.to_copy(tr, out[0], tr.dtype)
            sin = aten.to_copy(tr, out[1], tr.dtype)
        return cos, sin

    def kv_cache(self, layer: int, k: T, v: T, window: int = 0) -> tuple[T, T]:
        """``DynamicCache.update``: ``cat`` the cached rows and the new ones (the empty
        cache in prefill is a lifted ``[0]`` tensor). A sliding-window layer keeps the last
        ``window − 1`` rows (``DynamicSlidingWindowLayer``): a slice of each, after the
        ``cat``; attention reads the whole ``cat``."""
        tr = self.tr
        cached = self.caches.get(layer)
        if cached is None:
            empties = []
            for _ in range(2):
                raw = tr.tensor((0,))
                lifted = tr.view_of(raw, (0,))
                lifted.detached = True
                tr.record("aten.lift_fresh", [raw], [lifted], {})
                empties.append(lifted)
            ek, ev = empties
            k2 = aten.cat(tr, [ek, k], -2)
            v2 = aten.cat(tr, [ev, v], -2)
        else:
            k2 = aten.cat(tr, [cached[0], k], -2)
            v2 = aten.cat(tr, [cached[1], v], -2)
        kept = (k2, v2)
        if window:
            kept = tuple(aten.plain_slice(tr, c, 2, -(window - 1), INT64_MAX) for c in kept)
        if tr.phase != Phase.DECODE:
            self.caches[layer] = kept
        return k2, v2

    def head_and_loss(self, h: T, logits: int, train: bool, cls: str,
                      head_param: str) -> T:
        """The LM head on the last ``logits`` positions; in training the shifted-label
        cross-entropy (fp32 logits, ``_log_softmax``, ``nll_loss_forward``)."""
        tr = self.tr
        d = self.m.d
        with tr.module("", cls):
            if train:
                x = aten.alias(tr, h)
            else:
                x = aten.slice_(tr, h, 1, -logits, INT64_MAX)
        with tr.module("lm_head", "Linear"):
            w = tr.param(head_param, (d.vocab, d.hidden))
            wt = aten.t(tr, w)
            b, s, _ = x.shape
            x2 = aten.view(tr, x, (b * s, d.hidden))
            y = aten.mm(tr, x2, wt)
            y = aten.unsafe_view(tr, y, (b, s, d.vocab))
        if not train:
            return y
        with tr.module("", cls):
            y = aten.to_copy(tr, y, F32)
            padded = tr.tensor((self.batch, self.seq + 1), I64)
            tr.record("aten.constant_pad_nd", [self.ids], [padded],
                      {"pad": (0, 1), "value": -100.0})
            labels = aten.plain_slice(tr, padded, 1, 1, INT64_MAX)
            if self.batch > 1:  # .contiguous(): one row of a batch of one already is
                shifted, labels = labels, tr.tensor((self.batch, self.seq), I64)
                tr.record("aten.clone", [shifted], [labels], {})
            flat = aten.view(tr, y, (b * s, d.vocab), size=(-1, d.vocab))
            target = tr.view_of(labels, (b * s,))
            tr.record("aten.view", [labels], [target], {"size": (-1,)})
            logp = aten.log_softmax(tr, flat, 1)
            return aten.nll_loss(tr, logp, target)

    ids: T


# -- llama-shaped families -------------------------------------------------------------------


def _llama_forward(run: _Run, s: int, cache_len: int, logits: int, train: bool) -> T:
    tr, m, d = run.tr, run.m, run.m.d
    b = run.batch
    ids = tr.tensor((b, s), I64)
    run.ids = ids
    with tr.module(f"{m.root}.embed_tokens", "Embedding"):
        w = tr.param(f"{m.root}.embed_tokens.weight", (d.vocab, d.hidden))
        h = aten.embedding(tr, w, ids)
    with tr.module(m.root, f"{m.prefix}Model"):
        pos = run.positions(s, cache_len)
    cos, sin = run.rotary(pos, d.head_dim)
    for _kind, indices, is_moe, window in m.kinds:
        i = indices[0]
        h = _llama_layer(run, i, h, cos, sin, is_moe, window)
    h = run.rms_norm(f"{m.root}.norm", f"{m.prefix}RMSNorm", h)
    head = f"{m.root}.embed_tokens.weight" if d.tie_word_embeddings else "lm_head.weight"
    return run.head_and_loss(h, logits, train, f"{m.prefix}ForCausalLM", head)


def _llama_layer(run: _Run, i: int, h: T, cos: T, sin: T, is_moe: bool, window: int) -> T:
    tr, m = run.tr, run.m
    base = f"{m.layers_path}.{i}"
    p = m.prefix
    x = run.rms_norm(f"{base}.input_layernorm", f"{p}RMSNorm", h)
    a = _llama_attention(run, i, f"{base}.self_attn", x, cos, sin, window)
    with tr.module(base, f"{p}DecoderLayer"):
        h = aten.add(tr, h, a)
    x = run.rms_norm(f"{base}.post_attention_layernorm", f"{p}RMSNorm", h)
    if is_moe:
        y = _moe_block(run, f"{base}.mlp", x)
    else:
        y = _swiglu_mlp(run, f"{base}.mlp", f"{p}MLP", x, run.m.d.ffn)
    with tr.module(base, f"{p}DecoderLayer"):
        return aten.add(tr, h, y)


def _rope(run: _Run, x: T, cos: T, sin: T) -> T:
    """``q·cos + rotate_half(q)·sin``; cos/sin unsqueezed by the caller."""
    tr = run.tr
    half = x.shape[-1] // 2
    a = aten.mul(tr, x, cos)
    x1 = aten.slice_(tr, x, 3, 0, half)
    x2 = aten.slice_(tr, x, 3, half, INT64_MAX)
    rot = aten.cat(tr, [aten.neg(tr, x2), x1], -1)
    return aten.add(tr, a, aten.mul(tr, rot, sin))


def _llama_attention(run: _Run, i: int, path: str, x: T, cos: T, sin: T, window: int) -> T:
    tr, m, d = run.tr, run.m, run.m.d
    b, s, _ = x.shape
    hd = d.head_dim
    cls = f"{m.prefix}Attention"
    bias = m.model_type in _QKV_BIAS or bool(m.cfg.get("attention_bias"))
    heads = {}
    for name, n in (("q", d.heads), ("k", d.kv_heads), ("v", d.kv_heads)):
        y = run.linear(f"{path}.{name}_proj", x, n * hd, bias=bias)
        with tr.module(path, cls):
            y = aten.view(tr, y, (b, s, n, hd), size=(b, s, -1, hd))
        if name in ("q", "k") and m.model_type in _QK_NORM:
            y = run.rms_norm(f"{path}.{name}_norm", f"{m.prefix}RMSNorm", y, hd)
        with tr.module(path, cls):
            heads[name] = aten.transpose(tr, y, 1, 2)
    with tr.module(path, cls):
        c = aten.unsqueeze(tr, cos, 1)
        sn = aten.unsqueeze(tr, sin, 1)
        q = _rope(run, heads["q"], c, sn)
        k = _rope(run, heads["k"], c, sn)
        v = heads["v"]
        if not run.training:
            k, v = run.kv_cache(i, k, v, window)
        attrs = {"is_causal": True, "window": window, "chunk": 0, "scale": hd ** -0.5,
                 "softcap": 0.0}
        o = aten.attention(tr, q, k, v, attrs)
        o = aten.view(tr, o, (b, s, d.heads * hd), size=(b, s, -1))
    return run.linear(f"{path}.o_proj", o, d.hidden, bias=bool(m.cfg.get("attention_bias")))


def _swiglu_mlp(run: _Run, path: str, cls: str, x: T, ffn: int) -> T:
    tr, d = run.tr, run.m.d
    bias = bool(run.m.cfg.get("mlp_bias"))
    g = run.linear(f"{path}.gate_proj", x, ffn, bias=bias)
    with tr.module(f"{path}.act_fn", "SiLUActivation"):
        g = aten.silu(tr, g)
    u = run.linear(f"{path}.up_proj", x, ffn, bias=bias)
    with tr.module(path, cls):
        y = aten.mul(tr, g, u)
    return run.linear(f"{path}.down_proj", y, d.hidden, bias=bias)


def _moe_block(run: _Run, path: str, x: T) -> T:
    """A sparse MoE block: router (linear, fp32 softmax, top-k, renormalise), then the
    routed experts as the capture's balanced path runs them."""
    from zrt_core.capture.moe import routing_histogram

    tr, m, d = run.tr, run.m, run.m.d
    p = m.prefix
    b, s, hdim = x.shape
    tokens = b * s
    block = f"{p}SparseMoeBlock"
    with tr.module(path, block):
        flat = aten.view(tr, x, (tokens, hdim), size=(-1, hdim))
    with tr.module(f"{path}.gate", f"{p}TopKRouter"):
        r_in = aten.view(tr, flat, (tokens, hdim), size=(-1, hdim))
        w = tr.param(f"{path}.gate.weight", (d.experts, hdim))
        logits = aten.mm(tr, r_in, aten.t(tr, w))
        probs = aten.softmax(tr, aten.to_copy(tr, logits, F32), -1)
        vals, idx = aten.topk(tr, probs, d.top_k)
        norm = m.model_type == "mixtral" or bool(m.cfg.get("norm_topk_prob"))
        if norm:
            total = aten.sum_last_keepdim(tr, vals)
            vals = aten.div_inplace(tr, vals, total)
        if m.model_type != "mixtral":
            vals = aten.to_copy(tr, vals, tr.dtype)
    experts = f"{path}.experts"
    ffn = d.moe_ffn
    with tr.module(experts, f"{p}Experts"):
        gu = tr.param(f"{experts}.gate_up_proj", (d.experts, 2 * ffn, hdim))
        dn = tr.param(f"{experts}.down_proj", (d.experts, hdim, ffn))
        gu_t = aten.transpose(tr, gu, -2, -1)
        dn_t = aten.transpose(tr, dn, -2, -1)
        routed, row_token, _row_expert = aten.moe_dispatch(tr, flat, idx, d.experts)
        rows = routing_histogram(tokens, d.top_k, d.experts, run.imbalance)
        raw = tr.tensor((d.experts,), "int32")
        offs = tr.view_of(raw, (d.experts,))
        offs.detached = True
        tr.record("aten.lift_fresh", [raw], [offs], {})
        up = aten.grouped_mm(tr, routed, gu_t, offs, rows)
        gate, upv = aten.split(tr, up, ffn, -1)
    with tr.module(f"{experts}.act_fn", "SiLUActivation"):
        gate = aten.silu(tr, gate)
    with tr.module(experts, f"{p}Experts"):
        act = aten.mul(tr, gate, upv)
        out = aten.grouped_mm(tr, act, dn_t, offs, rows)
        y = aten.moe_combine(tr, out, row_token, vals, tr.dtype)
    with tr.module(path, block):
        return aten.view(tr, y, (b, s, hdim))


# -- GPT-2 ------------------------------------------------------------------------------------


def _gpt2_forward(run: _Run, s: int, cache_len: int, logits: int, train: bool) -> T:
    tr, m, d = run.tr, run.m, run.m.d
    b = run.batch
    cfg = m.cfg
    n_pos = int(cfg.get("n_positions") or cfg.get("max_position_embeddings") or 1024)
    eps = float(cfg.get("layer_norm_epsilon") or 1e-5)
    ids = tr.tensor((b, s), I64)
    run.ids = ids
    with tr.module("transformer", "GPT2Model"):
        ids_v = tr.view_of(ids, (b, s))
        tr.record("aten.view", [ids], [ids_v], {"size": (-1, s)})
    with tr.module("transformer.wte", "Embedding"):
        wte = tr.param("transformer.wte.weight", (d.vocab, d.hidden))
        h = aten.embedding(tr, wte, ids_v)
    with tr.module("transformer", "GPT2Model"):
        pos = run.positions(s, cache_len)
    with tr.module("transformer.wpe", "Embedding"):
        wpe = tr.param("transformer.wpe.weight", (n_pos, d.hidden))
        pe = aten.embedding(tr, wpe, pos)
    with tr.module("transformer", "GPT2Model"):
        h = aten.add(tr, h, pe)
    if train:
        with tr.module("transformer.drop", "Dropout"):
            h = aten.dropout(tr, h, float(cfg.get("embd_pdrop", 0.1)))
    for _kind, indices, _moe, _window in m.kinds:
        h = _gpt2_block(run, indices[0], h, eps, train)
    with tr.module("transformer.ln_f", "LayerNorm"):
        h = aten.layer_norm(tr, h, tr.param("transformer.ln_f.weight", (d.hidden,)),
                            tr.param("transformer.ln_f.bias", (d.hidden,)), eps)
    with tr.module("transformer", "GPT2Model"):
        h = aten.view(tr, h, h.shape, size=(-1, s, d.hidden))
    head = "transformer.wte.weight" if d.tie_word_embeddings else "lm_head.weight"
    return run.head_and_loss(h, logits, train, "GPT2LMHeadModel", head)


def _gpt2_block(run: _Run, i: int, h: T, eps: float, train: bool) -> T:
    tr, d = run.tr, run.m.d
    cfg = run.m.cfg
    base = f"transformer.h.{i}"
    b, s, hidden = h.shape
    hd = d.head_dim
    resid_p = float(cfg.get("resid_pdrop", 0.1))
    with tr.module(f"{base}.ln_1", "LayerNorm"):
        x = aten.layer_norm(tr, h, tr.param(f"{base}.ln_1.weight", (hidden,)),
                            tr.param(f"{base}.ln_1.bias", (hidden,)), eps)
    qkv = run.conv1d(f"{base}.attn.c_attn", x, 3 * hidden)
    with tr.module(f"{base}.attn", "GPT2Attention"):
        q, k, v = aten.split(tr, qkv, hidden, 2)
        heads = {}
        for name, t_ in (("k", k), ("v", v), ("q", q)):
            y = aten.view(tr, t_, (b, s, d.heads, hd), size=(b, s, -1, hd))
            heads[name] = aten.transpose(tr, y, 1, 2)
        kk, vv = heads["k"], heads["v"]
        if not run.training:
            kk, vv = run.kv_cache(i, kk, vv)
        attrs = {"is_causal": True, "window": 0, "chunk": 0, "scale": hd ** -0.5,
                 "softcap": 0.0}
        o = aten.attention(tr, heads["q"], kk, vv, attrs)
        o = aten.view(tr, o, (b, s, hidden), size=(b, s, -1))
    o = run.conv1d(f"{base}.attn.c_proj", o, hidden)
    if train:
        with tr.module(f"{base}.attn.resid_dropout", "Dropout"):
            o = aten.dropout(tr, o, resid_p)
    with tr.module(base, "GPT2Block"):
        h = aten.add(tr, o, h)
    with tr.module(f"{base}.ln_2", "LayerNorm"):
        x = aten.layer_norm(tr, h, tr.param(f"{base}.ln_2.weight", (hidden,)),
                            tr.param(f"{base}.ln_2.bias", (hidden,)), eps)
    y = run.conv1d(f"{base}.mlp.c_fc", x, d.ffn)
    with tr.module(f"{base}.mlp.act", "NewGELUActivation"):
        y = _gelu_new(run, y)
    y = run.conv1d(f"{base}.mlp.c_proj", y, hidden)
    if train:
        with tr.module(f"{base}.mlp.dropout", "Dropout"):
            y = aten.dropout(tr, y, resid_p)
    with tr.module(base, "GPT2Block"):
        return aten.add(tr, h, y)


def _gelu_new(run: _Run, x: T) -> T:
    """``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`` as HF's ``NewGELUActivation``."""
    tr = run.tr
    half = aten.mul_scalar_tensor(tr, x, 0.5)
    cube = aten.mul_scalar_tensor(tr, aten.pow_(tr, x, 3.0), 0.044715)
    inner = aten.mul_scalar_tensor(tr, aten.add(tr, x, cube), math.sqrt(2 / math.pi))
    th = aten.add_scalar(tr, aten.tanh(tr, inner))
    return aten.mul(tr, half, th)


__all__ = ["FAMILIES", "analytic_capture", "supported"]
