"""The layer-by-layer shape of a decoder-only LLM, read from its config without building it.

:func:`architecture` turns a HuggingFace config mapping into an :class:`Architecture`: one
:class:`LayerSpec` per decoder layer with the weights it holds (split into matmul weights,
which cost ``2 × params`` FLOPs per token, and the rest: norms, biases, convolutions) and
the attention or state-space geometry the per-token FLOP formulas need. It follows what
each family's transformers implementation builds, so the parameter counts match
``sum(p.numel() for p in model.parameters())`` of the language model (vision towers and
multi-token-prediction layers excluded). Pure Python; no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from attrs import field, frozen

from zrt_core.errors import ModelError
from zrt_core.modelinfo import ModelDims, ernie_moe_layers, text_config

# Families whose MLP is up → activation → down (no gate).
_UNGATED_MLP = frozenset({"gpt2", "opt", "bloom", "nemotron", "nemotron_h", "gpt_neox", "gptj",
                          "phi", "falcon", "starcoder2", "mpt", "gpt_bigcode", "arcee",
                          "apertus", "persimmon", "xglm", "gpt_neo"})
# Families with LayerNorm (weight and bias) rather than RMSNorm (weight only).
_LAYERNORM = frozenset({"gpt2", "opt", "bloom", "nemotron", "gpt_neox", "gptj", "phi",
                        "falcon", "starcoder2", "gpt_bigcode", "persimmon", "xglm",
                        "gpt_neo"})
# Families whose every linear layer has a bias.
_ALL_BIASES = frozenset({"gpt2", "opt", "bloom", "gpt_neox", "gptj", "phi", "starcoder2",
                         "gpt_bigcode", "persimmon", "xglm"})
# Families with biases on q, k, v only.
_QKV_BIAS = frozenset({"qwen2", "qwen2_moe"})
# Families with an RMSNorm over each query and key head.
_QK_NORM = frozenset({"qwen3", "qwen3_moe", "gemma3_text", "olmo2", "qwen3_next", "qwen3_5_text",
                      "qwen3_5_moe_text", "apertus"})
# Families of Qwen3-Next's hybrid: three Gated DeltaNet (linear attention) layers to one
# gated full-attention layer (``layer_types``, else every ``full_attention_interval``-th
# layer full). The full-attention ``q_proj`` also produces a per-channel output gate
# (heads × head_dim × 2 outputs; transformers' ``Qwen3NextAttention``), and a shared
# expert's output passes a sigmoid gate (hidden → 1).
_GATED_DELTANET = frozenset({"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"})
# Families with four norms per layer (before and after attention and MLP).
_SANDWICH_NORM = frozenset({"gemma2", "gemma3_text"})
_MLA = frozenset({"deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2"})
# transformers' default sliding_window for families that always have sliding layers.
# Mamba-2 hybrids with an MLP (or MoE) in every layer and a Mamba-2 mixer or attention
# before it (IBM Bamba, Granite 4.0-H): the mixer per layer from ``attn_layer_indices``
# (Bamba) or ``layer_types`` (``mamba``/``linear_attention`` or ``attention``/
# ``full_attention``).
_MAMBA_HYBRID = frozenset({"bamba", "granitemoehybrid"})
_DEFAULT_WINDOW = {"gemma2": 4096, "gemma3_text": 4096, "gpt_oss": 128, "gpt_neo": 256}
#: Text models of multimodal families that transformers builds only inside the multimodal
#: model → the causal-LM family whose layers they are (the capture builds them as that
#: family: ``capture.build.text_config_of``).
TEXT_EQUIVALENT_FAMILIES: Mapping[str, str] = {
    "qwen3_vl_moe_text": "qwen3_moe", "qwen3_vl_text": "qwen3", "qwen2_5_vl_text": "qwen2",
    "qwen2_vl_text": "qwen2", "glm4v_text": "glm4", "glm4v_moe_text": "glm4_moe",
}
_UNSUPPORTED = {
    "deepseek_v4": "compressed sparse attention with hyper-connections",
}


@frozen
class AttentionSpec:
    """What the attention of one layer computes per query.

    :param heads: query heads.
    :param qk_dim: width of one query/key head in the score product ``QKᵀ``.
    :param v_dim: width of one value head in ``AV``.
    :param window: sliding window in keys (the query included), or None.
    :param chunk: chunked attention (Llama 4): queries see only their chunk, or None.
    :param sparse_topk: keys each query attends after a top-k selection (DeepSeek sparse
        attention), or None.
    :param indexer_heads: heads of the lightning indexer that scores every key for the
        top-k selection (0 without one); ``indexer_dim`` their width.
    :param decode_qk_dim: width of ``QKᵀ`` with absorbed MLA weights
        (``kv_lora_rank + qk_rope_head_dim``): every decode step, and DeepSeek sparse
        attention over sequences longer than ``sparse_topk``; 0 for ordinary attention.
    :param decode_v_dim: width of ``AV`` with absorbed MLA (``kv_lora_rank``).
    """

    heads: int
    qk_dim: int
    v_dim: int
    window: int | None = None
    chunk: int | None = None
    sparse_topk: int | None = None
    indexer_heads: int = 0
    indexer_dim: int = 0
    decode_qk_dim: int = 0
    decode_v_dim: int = 0


@frozen
class MambaSpec:
    """A Mamba-2 mixer: ``heads × head_dim`` channels, each with a ``state``-wide state."""

    heads: int
    head_dim: int
    state: int
    groups: int
    conv_kernel: int

    @property
    def inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.inner + 2 * self.groups * self.state


@frozen
class DeltaNetSpec:
    """A Gated DeltaNet mixer (Qwen3-Next's linear attention): ``k_heads`` query/key heads
    of width ``k_dim``, ``v_heads`` value heads of width ``v_dim`` (each holding a
    ``k_dim × v_dim`` state; query and key heads are shared by ``v_heads / k_heads`` value
    heads), a depthwise causal convolution of ``conv_kernel`` taps over q, k and v."""

    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int
    conv_kernel: int

    @property
    def key_width(self) -> int:
        return self.k_heads * self.k_dim

    @property
    def value_width(self) -> int:
        return self.v_heads * self.v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_width + self.value_width


@frozen
class LayerSpec:
    """One decoder layer: its kind, weights and mixer geometry.

    ``matmul_params`` are weights every token multiplies (attention or SSM projections,
    dense MLP, shared experts, router); ``expert_params`` the routed experts' weights, of
    which each token uses ``active_expert_params``; ``other_params`` everything that is not
    a matmul weight (norms, biases, convolution, SSM constants).
    """

    index: int
    kind: str
    matmul_params: int
    other_params: int
    expert_params: int = 0
    active_expert_params: int = 0
    attention: AttentionSpec | None = None
    mamba: MambaSpec | None = None
    delta: DeltaNetSpec | None = None

    @property
    def total_params(self) -> int:
        return self.matmul_params + self.other_params + self.expert_params

    @property
    def active_matmul_params(self) -> int:
        return self.matmul_params + self.active_expert_params


@frozen
class Architecture:
    """A whole language model: embeddings, layers, final norm and head."""

    dims: ModelDims
    family: str
    layers: tuple[LayerSpec, ...] = field(converter=tuple)
    embedding_params: int  # token embeddings, plus learned positions where the family has them
    head_params: int  # the LM head matmul (vocab × hidden), counted once even when tied
    tied_head: bool
    other_params: int  # final norm, embedding norms and projections outside the layers

    @property
    def kinds(self) -> dict[str, int]:
        """Layer kind → how many layers of it, in first-seen order."""
        out: dict[str, int] = {}
        for layer in self.layers:
            out[layer.kind] = out.get(layer.kind, 0) + 1
        return out


def architecture(config: Mapping[str, Any]) -> Architecture:
    """Describe a model from its HuggingFace config mapping.

    :raises ModelError: a missing essential field, or a family whose computation zrt's
        analytic model does not describe (named, with what is missing).
    """
    dims = ModelDims.from_config(config)
    cfg = text_config(config)
    family = str(cfg.get("model_type") or dims.model_type)
    family = {"gemma3": "gemma3_text", "llama4": "llama4_text",
              **TEXT_EQUIVALENT_FAMILIES}.get(family, family)
    if family in _UNSUPPORTED:
        raise ModelError(
            f"no analytic model for model_type {family!r} ({_UNSUPPORTED[family]})",
            "capture still works; its FLOPs are reported without an analytic check",
        )
    builder = _Builder(dims, cfg, family)
    layers = tuple(builder.layer(i, kind) for i, kind in enumerate(_layer_kinds(dims, cfg,
                                                                                family)))
    return Architecture(
        dims=dims,
        family=family,
        layers=layers,
        embedding_params=builder.embedding_params(),
        head_params=dims.vocab * dims.hidden,
        tied_head=dims.tie_word_embeddings,
        other_params=builder.model_other_params(),
    )


# -- layer kinds ------------------------------------------------------------------------

_NEMOTRON_H_PATTERN = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
_NEMOTRON_H_TYPES = {"linear_attention": "mamba", "mamba": "mamba", "full_attention": "attention",
                     "attention": "attention", "mlp": "mlp", "moe": "moe"}


def _layer_kinds(dims: ModelDims, cfg: Mapping[str, Any], family: str) -> list[str]:
    """A kind per layer: ``dense``/``moe`` (+ ``_sliding``/``_chunked``/``_full`` where the
    family mixes attention types), or ``mamba``/``attention``/``mlp``/``moe`` for
    nemotron_h's one-mixer-per-block layers."""
    if family == "nemotron_h":
        pattern = cfg.get("hybrid_override_pattern")
        types = cfg.get("layers_block_type") or cfg.get("layer_types")
        if isinstance(pattern, str):
            kinds = [_NEMOTRON_H_PATTERN.get(c) for c in pattern]
        elif isinstance(types, Sequence):
            kinds = [_NEMOTRON_H_TYPES.get(str(t)) for t in types]
        else:
            raise ModelError("nemotron_h config has no hybrid_override_pattern or "
                             "layers_block_type", "add the layer pattern to config.json")
        if None in kinds:
            raise ModelError("nemotron_h layer pattern has an unknown block type",
                             "use M (mamba), * (attention), - (mlp) or E (moe)")
        return [str(k) for k in kinds]
    if family in _MAMBA_HYBRID:
        ffn = "+moe" if dims.experts else ""
        return [mixer + ffn for mixer in _hybrid_mixers(dims, cfg, family)]
    moe = _moe_layer_set(dims, cfg, family)
    attn = _attention_types(dims, cfg, family)
    mixed = len(set(attn)) > 1
    out = []
    for i in range(dims.layers):
        kind = "moe" if i in moe else "dense"
        if mixed:
            kind += "_" + attn[i].removesuffix("_attention")
        out.append(kind)
    return out


def _hybrid_mixers(dims: ModelDims, cfg: Mapping[str, Any], family: str) -> list[str]:
    """``mamba`` / ``attention`` per layer of a :data:`_MAMBA_HYBRID` family."""
    n = dims.layers
    if family == "bamba":
        attn = {int(i) for i in cfg.get("attn_layer_indices") or ()}
        return ["attention" if i in attn else "mamba" for i in range(n)]
    types = cfg.get("layer_types") or cfg.get("layers_block_type")
    if isinstance(types, list | tuple) and len(types) == n:
        return ["mamba" if str(t) in ("mamba", "linear_attention") else "attention"
                for t in types]
    return ["mamba"] * n


def _mamba_spec(cfg: Mapping[str, Any]) -> MambaSpec:
    """A Mamba-2 mixer's geometry, by Nemotron-H's keys or Bamba's / Granite's
    (``mamba_n_heads``, ``mamba_d_head``, ``mamba_d_state``, ``mamba_n_groups``,
    ``mamba_d_conv``)."""
    def first(*keys: str, default: int) -> int:
        for k in keys:
            if cfg.get(k) is not None:
                return int(cfg[k])
        return default

    return MambaSpec(heads=first("mamba_num_heads", "mamba_n_heads", default=128),
                     head_dim=first("mamba_head_dim", "mamba_d_head", default=64),
                     state=first("ssm_state_size", "mamba_d_state", default=128),
                     groups=first("n_groups", "mamba_n_groups", default=8),
                     conv_kernel=first("conv_kernel", "mamba_d_conv", default=4))


def _moe_layer_set(dims: ModelDims, cfg: Mapping[str, Any], family: str) -> set[int]:
    if not dims.experts:
        return set()
    layers = dims.layers
    if cfg.get("first_k_dense_replace") is not None:
        first = int(cfg["first_k_dense_replace"])
        freq = int(cfg.get("moe_layer_freq") or 1)
        return {i for i in range(first, layers) if i % freq == 0}
    if cfg.get("moe_layer_start_index") is not None:  # ernie4_5_moe
        return ernie_moe_layers(cfg, layers)
    if family == "llama4_text":
        step = int(cfg.get("interleave_moe_layer_step") or 1)
        if isinstance(cfg.get("moe_layers"), list | tuple):
            return {int(i) for i in cfg["moe_layers"]}
        return set(range(step - 1, layers, step))
    layer_types = cfg.get("mlp_layer_types")
    if isinstance(layer_types, list | tuple):
        return {i for i, t in enumerate(layer_types)
                if "moe" in str(t).lower() or "sparse" in str(t).lower()}
    mlp_only = set(cfg.get("mlp_only_layers") or ())
    step = int(cfg.get("decoder_sparse_step") or 1)
    return {i for i in range(layers) if i not in mlp_only and (i + 1) % step == 0}


def _attention_types(dims: ModelDims, cfg: Mapping[str, Any], family: str) -> list[str]:
    """``full_attention`` / ``sliding_attention`` / ``chunked_attention`` per layer, by the
    same rules each family's transformers config applies when ``layer_types`` is absent."""
    n = dims.layers
    given = cfg.get("layer_types")
    if isinstance(given, list | tuple) and len(given) == n:
        return [str(t) for t in given]
    window = cfg.get("sliding_window")
    if family == "gemma2":
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    if family == "gemma3_text":
        pattern = int(cfg.get("sliding_window_pattern") or 6)
        return ["sliding_attention" if (i + 1) % pattern else "full_attention"
                for i in range(n)]
    if family == "gpt_oss":
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    if family == "gpt_neo":  # attention_types [[["global", "local"], 12]] unrolled
        types = [t for pattern, repeat in cfg.get("attention_types") or [[["global", "local"],
                                                                           n // 2]]
                 for _ in range(int(repeat)) for t in pattern]
        return ["sliding_attention" if t == "local" else "full_attention" for t in types][:n]
    if family in _GATED_DELTANET:
        interval = int(cfg.get("full_attention_interval") or 4)
        return ["linear_attention" if (i + 1) % interval else "full_attention"
                for i in range(n)]
    if family == "llama4_text":
        no_rope = cfg.get("no_rope_layers")
        if not isinstance(no_rope, list | tuple) or len(no_rope) != n:
            interval = int(cfg.get("no_rope_layer_interval") or 4)
            no_rope = [int((i + 1) % interval != 0) for i in range(n)]
        chunked = cfg.get("attention_chunk_size") is not None
        return ["chunked_attention" if (rope and chunked) else "full_attention"
                for rope in no_rope]
    if family in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        if cfg.get("use_sliding_window") and window:
            first = int(cfg.get("max_window_layers") or n)
            return ["sliding_attention" if i >= first else "full_attention" for i in range(n)]
        return ["full_attention"] * n
    if family in ("mistral", "mixtral", "phi3", "starcoder2") and window:
        return ["sliding_attention"] * n
    return ["full_attention"] * n


# -- weights ----------------------------------------------------------------------------


class _Builder:
    """Weights and geometry per layer, following the family's transformers modules."""

    def __init__(self, dims: ModelDims, cfg: Mapping[str, Any], family: str) -> None:
        self.d = dims
        self.cfg = cfg
        self.family = family
        self.norm = 2 * dims.hidden if family in _LAYERNORM else dims.hidden
        self.gated = family not in _UNGATED_MLP
        self.attn_bias = family in _ALL_BIASES or bool(cfg.get("attention_bias")
                                                      and family not in _MLA)
        self.mlp_bias = family in _ALL_BIASES or family == "gpt_neo" or bool(cfg.get("mlp_bias"))
        self.attn_types = None if family == "nemotron_h" else _attention_types(dims, cfg, family)

    # -- model-level --------------------------------------------------------------------

    def embedding_params(self) -> int:
        d, cfg = self.d, self.cfg
        if self.family == "opt":
            proj = int(cfg.get("word_embed_proj_dim") or d.hidden)
            positions = (int(cfg.get("max_position_embeddings") or 2048) + 2) * d.hidden
            return d.vocab * proj + positions
        if self.family == "gpt_neo":
            positions = int(cfg.get("max_position_embeddings") or 2048)
            return d.vocab * d.hidden + positions * d.hidden
        if self.family == "gpt2":
            positions = int(cfg.get("n_positions") or cfg.get("max_position_embeddings") or 1024)
            return d.vocab * d.hidden + positions * d.hidden
        return d.vocab * d.hidden

    def model_other_params(self) -> int:
        d, cfg = self.d, self.cfg
        out = self.norm  # final norm
        if self.family == "opt":
            proj = int(cfg.get("word_embed_proj_dim") or d.hidden)
            if proj != d.hidden:  # project_in and project_out, no bias
                out += 2 * proj * d.hidden
            if not cfg.get("do_layer_norm_before", True) or cfg.get("_remove_final_layer_norm"):
                out -= self.norm
        if self.family == "bloom":
            out += self.norm  # word_embeddings_layernorm
        return out

    # -- layers -------------------------------------------------------------------------

    def layer(self, index: int, kind: str) -> LayerSpec:
        if self.family == "nemotron_h":
            return self._nemotron_h_layer(index, kind)
        if self.family in _MAMBA_HYBRID:
            return self._hybrid_layer(index, kind)
        if self.family == "falcon_h1":
            return self._falcon_h1_layer(index, kind)
        delta = None
        if self.attn_types and self.attn_types[index] == "linear_attention" and \
                self.family in _GATED_DELTANET:
            attn_matmul, attn_other, delta = self._delta_net()
            attention = None
        else:
            attn_matmul, attn_other, attention = self._attention(index)
        if kind.startswith("moe"):
            mlp_matmul, mlp_other, experts, active = self._moe()
        else:
            mlp_matmul, mlp_other = self._dense_mlp(self._dense_ffn())
            experts = active = 0
        norms = (4 if self.family in _SANDWICH_NORM else 2) * self.norm
        return LayerSpec(index=index, kind=kind, matmul_params=attn_matmul + mlp_matmul,
                         other_params=attn_other + mlp_other + norms, expert_params=experts,
                         active_expert_params=active, attention=attention, delta=delta)

    def _delta_net(self) -> tuple[int, int, DeltaNetSpec]:
        """Gated DeltaNet weights (transformers' ``Qwen3NextGatedDeltaNet``; Qwen3.5 splits
        the same input projection in four): q, k, v, the output gate z (value width) and
        the per-value-head b and a from the hidden state; ``out_proj`` back; a depthwise
        convolution over q, k, v without bias; ``dt_bias`` and ``A_log`` per value head;
        a gated RMSNorm over one value head."""
        cfg, h = self.cfg, self.d.hidden
        spec = DeltaNetSpec(k_heads=int(cfg.get("linear_num_key_heads") or 16),
                            v_heads=int(cfg.get("linear_num_value_heads") or 32),
                            k_dim=int(cfg.get("linear_key_head_dim") or 128),
                            v_dim=int(cfg.get("linear_value_head_dim") or 128),
                            conv_kernel=int(cfg.get("linear_conv_kernel_dim") or 4))
        matmul = h * (spec.conv_dim + spec.value_width + 2 * spec.v_heads) + \
            spec.value_width * h
        other = spec.conv_dim * spec.conv_kernel + 2 * spec.v_heads + spec.v_dim
        return matmul, other, spec

    def _dense_ffn(self) -> int:
        d, cfg = self.d, self.cfg
        if self.family == "llama4_text":
            return int(cfg.get("intermediate_size_mlp") or d.ffn)
        if d.ffn:
            return d.ffn
        raise ModelError(f"config has no dense MLP width for {self.family}",
                         "add intermediate_size to config.json")

    def _window(self, index: int) -> tuple[int | None, int | None]:
        kind = self.attn_types[index] if self.attn_types else "full_attention"
        if kind == "sliding_attention":
            window = self.cfg.get("sliding_window") or self.cfg.get("window_size") \
                or _DEFAULT_WINDOW.get(self.family)
            if not window:
                raise ModelError(f"layer {index} is sliding_attention but config has no "
                                 "sliding_window", "add sliding_window to config.json")
            return int(window), None
        if kind == "chunked_attention":
            return None, int(self.cfg["attention_chunk_size"])
        return None, None

    def _attention(self, index: int) -> tuple[int, int, AttentionSpec]:
        d, h = self.d, self.d.hidden
        window, chunk = self._window(index)
        if self.family in _MLA:
            return self._mla(window)
        q, kv = d.heads * d.head_dim, d.kv_heads * d.head_dim
        matmul = h * q + 2 * h * kv + q * h
        if self.family in _GATED_DELTANET:
            matmul += h * q  # the output gate's half of q_proj
        other = 0
        if self.attn_bias:
            other += q + 2 * kv + h
        elif self.family in _QKV_BIAS:
            other += q + 2 * kv
        if self.family in _QK_NORM or (self.family == "hunyuan_v1_moe"
                                       and self.cfg.get("use_qk_norm")):
            other += 2 * d.head_dim  # (HunYuan: query_layernorm / key_layernorm)
        if self.family == "persimmon" and self.cfg.get("qk_layernorm", True):
            other += 4 * d.head_dim  # LayerNorms (weight and bias) over query and key heads
        if self.family == "gpt_oss":
            other += d.heads  # attention sinks
        if self.family == "gpt_neo":
            other += h  # out_proj's bias (q, k, v have none)
        return matmul, other, AttentionSpec(heads=d.heads, qk_dim=d.head_dim, v_dim=d.head_dim,
                                            window=window, chunk=chunk)

    def _mla(self, window: int | None) -> tuple[int, int, AttentionSpec]:
        d, cfg, h = self.d, self.cfg, self.d.hidden
        nope = d.qk_nope_head_dim or 128
        rope = d.qk_rope_head_dim or 64
        v = d.v_head_dim or nope
        qk = nope + rope
        if d.q_lora_rank:
            q_matmul, q_other = h * d.q_lora_rank + d.q_lora_rank * d.heads * qk, d.q_lora_rank
        else:
            q_matmul, q_other = h * d.heads * qk, 0
        kv_matmul = h * (d.kv_lora_rank + rope) + d.kv_lora_rank * d.heads * (nope + v)
        matmul = q_matmul + kv_matmul + d.heads * v * h
        other = q_other + d.kv_lora_rank
        topk = indexer_heads = indexer_dim = 0
        if self.family == "deepseek_v32":
            # Lightning indexer: wq_b (q_lora → heads × dim), wk (hidden → dim), k_norm
            # (LayerNorm, weight + bias), weights_proj (hidden → heads).
            indexer_heads = int(cfg.get("index_n_heads") or 64)
            indexer_dim = int(cfg.get("index_head_dim") or 128)
            topk = int(cfg.get("index_topk") or 2048)
            q_in = d.q_lora_rank or h
            matmul += q_in * indexer_heads * indexer_dim + h * indexer_dim + h * indexer_heads
            other += 2 * indexer_dim
        return matmul, other, AttentionSpec(
            heads=d.heads, qk_dim=qk, v_dim=v, window=window,
            sparse_topk=topk or None, indexer_heads=indexer_heads, indexer_dim=indexer_dim,
            decode_qk_dim=d.kv_lora_rank + rope, decode_v_dim=d.kv_lora_rank)

    def _dense_mlp(self, ffn: int) -> tuple[int, int]:
        h = self.d.hidden
        matmul = (3 if self.gated else 2) * h * ffn
        other = ((2 if self.gated else 1) * ffn + h) if self.mlp_bias else 0
        if self.family == "apertus":
            other += 2  # xIELU's two learned scalars (alpha_p, alpha_n)
        return matmul, other

    def _moe(self) -> tuple[int, int, int, int]:
        """(always-used matmul params, other params, routed expert params, active ones)."""
        d, cfg, h = self.d, self.cfg, self.d.hidden
        e, k, ffn = d.experts, d.top_k, d.moe_ffn
        router = h * e
        other = 0
        if self.family == "gpt_oss":
            # Router bias; each expert: gate_up (h → 2·ffn) and down (ffn → h), both biased.
            other += e
            per_expert = 3 * h * ffn
            expert_bias = 2 * ffn + h
            return router, other + e * expert_bias, e * per_expert, k * per_expert
        if self.family == "ernie4_5_moe":
            other += e  # e_score_correction_bias: a parameter here
        if self.family in _MLA and cfg.get("topk_method") == "noaux_tc":
            # e_score_correction_bias: a buffer in transformers, a weight in the checkpoint
            # (and in the published counts).
            other += e
        per_expert = (3 if self.gated else 2) * h * ffn
        shared = (3 if self.gated else 2) * h * d.shared_expert_ffn
        if (self.family == "qwen2_moe" or self.family in _GATED_DELTANET) and \
                d.shared_expert_ffn:
            shared += h  # shared_expert_gate: hidden → 1
        return router + shared, other, e * per_expert, k * per_expert

    def _mamba_mixer(self, *, in_bias: bool, out_bias: bool, conv_bias: bool,
                     norm: bool = True) -> tuple[int, int, MambaSpec]:
        """A Mamba-2 mixer's (matmul, other) weights: ``in_proj`` hidden → (z: inner) +
        (x, B, C: conv_dim) + (dt: heads), ``out_proj`` back, each with its bias when
        asked; the depthwise convolution; ``dt_bias``, ``A_log``, ``D`` per head; a gated
        RMSNorm over inner when ``norm``."""
        h = self.d.hidden
        m = _mamba_spec(self.cfg)
        matmul = h * (m.inner + m.conv_dim + m.heads) + m.inner * h
        bias = (m.inner + m.conv_dim + m.heads if in_bias else 0) + (h if out_bias else 0)
        conv = m.conv_dim * m.conv_kernel + (m.conv_dim if conv_bias else 0)
        return matmul, bias + conv + 3 * m.heads + (m.inner if norm else 0), m

    def _hybrid_layer(self, index: int, kind: str) -> LayerSpec:
        """Bamba / Granite 4.0-H: a Mamba-2 mixer or attention, then the layer's gated MLP
        (Bamba) or MoE (router, experts gated over ``intermediate_size``) plus a gated
        shared MLP of ``shared_intermediate_size`` (Granite); two RMSNorms."""
        d, cfg, h = self.d, self.cfg, self.d.hidden
        mamba = None
        attention = None
        if kind.startswith("mamba"):
            bias = bool(cfg.get("mamba_proj_bias"))
            matmul, other, mamba = self._mamba_mixer(
                in_bias=bias, out_bias=bias, conv_bias=bool(cfg.get("mamba_conv_bias", True)))
        else:
            matmul, other, attention = self._attention(index)
        experts = active = 0
        if self.family == "bamba":
            mlp, mlp_other = self._dense_mlp(self._dense_ffn())
        else:
            shared = int(cfg.get("shared_intermediate_size") or 0)
            mlp, mlp_other = 3 * h * shared, 0
            if d.experts:
                mlp += h * d.experts  # router
                per_expert = 3 * h * d.moe_ffn
                experts, active = d.experts * per_expert, d.top_k * per_expert
        return LayerSpec(index=index, kind=kind, matmul_params=matmul + mlp,
                         other_params=other + mlp_other + 2 * h, expert_params=experts,
                         active_expert_params=active, attention=attention, mamba=mamba)

    def _falcon_h1_layer(self, index: int, kind: str) -> LayerSpec:
        """Falcon-H1: attention and a Mamba-2 mixer side by side in every layer (their
        outputs summed), then a gated MLP; two RMSNorms. The mixer's inner width is
        ``mamba_d_ssm`` (else expand × hidden); its output projection's bias is
        ``projectors_bias``; its gated RMSNorm only with ``mamba_rms_norm``."""
        cfg, h = self.cfg, self.d.hidden
        a_matmul, a_other, attention = self._attention(index)
        m_matmul, m_other, mamba = self._mamba_mixer(
            in_bias=bool(cfg.get("mamba_proj_bias")), out_bias=bool(cfg.get("projectors_bias")),
            conv_bias=bool(cfg.get("mamba_conv_bias", True)),
            norm=bool(cfg.get("mamba_rms_norm")))
        mlp, mlp_other = self._dense_mlp(self._dense_ffn())
        return LayerSpec(index=index, kind=kind, matmul_params=a_matmul + m_matmul + mlp,
                         other_params=a_other + m_other + mlp_other + 2 * h,
                         attention=attention, mamba=mamba)

    def _nemotron_h_layer(self, index: int, kind: str) -> LayerSpec:
        d, cfg, h = self.d, self.cfg, self.d.hidden
        norm = h  # one RMSNorm per block
        if kind == "mamba":
            bias = bool(cfg.get("use_bias"))
            matmul, other, m = self._mamba_mixer(
                in_bias=bias, out_bias=bias, conv_bias=bool(cfg.get("use_conv_bias", True)))
            return LayerSpec(index=index, kind=kind, matmul_params=matmul,
                             other_params=other + norm, mamba=m)
        if kind == "attention":
            q, kv = d.heads * d.head_dim, d.kv_heads * d.head_dim
            bias = q + 2 * kv + h if cfg.get("attention_bias") else 0
            return LayerSpec(index=index, kind=kind, matmul_params=2 * h * q + 2 * h * kv,
                             other_params=bias + norm,
                             attention=AttentionSpec(heads=d.heads, qk_dim=d.head_dim,
                                                     v_dim=d.head_dim))
        if kind == "mlp":
            bias = d.ffn + h if cfg.get("mlp_bias") else 0
            return LayerSpec(index=index, kind=kind, matmul_params=2 * h * d.ffn,
                             other_params=bias + norm)
        # moe: router, shared expert (up/down), optional latent projections, routed experts
        # (up/down, no gate) in the latent width when there is one.
        e, k, ffn = d.experts, d.top_k, d.moe_ffn
        latent = int(cfg.get("moe_latent_size") or 0)
        width = latent or h
        always = h * e + 2 * h * d.shared_expert_ffn + (2 * h * latent if latent else 0)
        per_expert = 2 * width * ffn
        # The router's e_score_correction_bias is a checkpoint weight (a buffer in transformers).
        return LayerSpec(index=index, kind=kind, matmul_params=always, other_params=norm + e,
                         expert_params=e * per_expert, active_expert_params=k * per_expert)
