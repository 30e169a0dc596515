"""Model dimensions read from a HuggingFace config mapping, across families' key names.

:class:`ModelDims` is what layout checks, memory formulas and the analytic front-end need
without building the model: hidden size, layers, heads, FFN widths, experts. Families name
these differently (``n_embd`` in GPT-2, ``ffn_dim`` in OPT, ``num_local_experts`` in
Mixtral); :meth:`ModelDims.from_config` knows the aliases.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from attrs import frozen

from zrt_core.errors import ModelError

_HIDDEN = ("hidden_size", "n_embd", "d_model", "dim")
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_HEADS = ("num_attention_heads", "n_head", "num_heads", "n_heads", "attention_heads")
_KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num")
_FFN = ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size", "d_ff")
_MOE_FFN = ("moe_intermediate_size", "expert_intermediate_size")
_EXPERTS = ("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts")
_TOP_K = ("num_experts_per_tok", "moe_top_k", "top_k", "num_selected_experts", "moe_k",
          "moe_topk")
_SHARED = ("n_shared_experts", "num_shared_experts", "moe_num_shared_experts")
_VOCAB = ("vocab_size", "padded_vocab_size")
#: transformers' families whose MoE block builds every routed expert and its one shared MLP at
#: ``intermediate_size`` whatever ``moe_intermediate_size`` and ``num_shared_expert`` say
#: (HunYuan: ``HunYuanMoEV1Experts`` and ``HunYuanMoEV1MLP`` in transformers 5.x).
_FFN_SIZED_MOE = ("hunyuan_v1_moe",)
#: transformers' families without any attention layer.
PURE_SSM_TYPES = ("mamba", "mamba2", "falcon_mamba")


def _first(cfg: Mapping[str, Any], keys: Sequence[str]) -> Any:
    for k in keys:
        v = cfg.get(k)
        if v is not None:
            return v
    return None


def _one(cfg: Mapping[str, Any], keys: Sequence[str]) -> Any:
    """``_first``, where a per-layer list (HunYuan's ``moe_topk``) must hold one value."""
    v = _first(cfg, keys)
    if isinstance(v, list | tuple):
        if len(set(v)) > 1:
            key = next(k for k in keys if cfg.get(k) is not None)
            raise ModelError(f"config field {key} differs across layers ({sorted(set(v))}): "
                             "zrt reads one value per model", "give the field one value")
        return v[0] if v else None
    return v


def text_config(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language-model part of a (possibly multimodal) config."""
    inner = cfg.get("text_config")
    if isinstance(inner, Mapping) and _first(inner, _HIDDEN) is not None:
        return inner
    return cfg


@frozen
class ModelDims:
    """The numbers that shape parallel layouts and memory.

    ``ffn`` is the dense MLP width (0 when every layer is MoE and there is no dense FFN);
    ``moe_ffn`` the width of one routed expert. ``dense_layers`` and ``moe_layers`` add up
    to ``layers`` for MoE models; for dense models ``moe_layers`` is 0.
    """

    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    experts: int = 0
    top_k: int = 0
    shared_experts: int = 0
    moe_ffn: int = 0
    moe_layers: int = 0
    kv_lora_rank: int = 0  # MLA (DeepSeek): compressed KV width; 0 for ordinary attention
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0  # MLA: the part of a query/key head without rotary embedding
    v_head_dim: int = 0  # MLA: value head width (0: same as head_dim)
    q_lora_rank: int = 0  # MLA: compressed query width (0: queries projected directly)
    shared_expert_ffn: int = 0  # combined width of the always-on shared experts
    tie_word_embeddings: bool = False  # the LM head reuses the input embedding matrix
    o_groups: int = 0  # DeepSeek-V4: groups of heads its output projection splits them into
    mamba_heads: int = 0  # Mamba-2 mixers (Nemotron-H): SSM heads
    mamba_groups: int = 0  # Mamba-2: groups of heads sharing B and C (n_groups)

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    @property
    def is_moe(self) -> bool:
        return self.experts > 0 and self.moe_layers > 0

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelDims:
        """Read dimensions; a missing essential field is a :class:`ModelError` naming it."""
        cfg = text_config(config)
        model_type = str(config.get("model_type") or cfg.get("model_type") or "")

        def need(keys: Sequence[str], what: str) -> int:
            v = _first(cfg, keys)
            if v is None:
                raise ModelError(
                    f"config has no {what} (looked for {', '.join(keys)})",
                    "add the field to config.json",
                )
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ModelError(f"config field {what} must be a positive integer, got {v!r}")
            return v

        hidden = need(_HIDDEN, "hidden size")
        block_types = _block_types(cfg)
        if _first(cfg, _LAYERS) is None and block_types is not None:
            layers = len(block_types)  # nemotron_h saved by transformers: the list is the count
        else:
            layers = need(_LAYERS, "layer count")
        if model_type in PURE_SSM_TYPES:  # (mamba2's num_heads are its SSM heads)
            raise ModelError(f"model_type {model_type!r} is a pure state-space model (no "
                             "attention layers): zrt does not model it yet",
                             "zrt models attention decoders and their Mamba-2 hybrids "
                             "(nemotron_h, bamba, granitemoehybrid, falcon_h1)")
        heads = need(_HEADS, "attention head count")
        kv_heads = _first(cfg, _KV_HEADS) or heads
        if cfg.get("multi_query") is True:  # falcon / starcoder style
            kv_heads = 1
        head_dim = cfg.get("head_dim") or hidden // heads
        ffn = _first(cfg, _FFN)
        if ffn is None:
            if model_type in ("gpt2", "bloom", "gpt_neox", "gptj", "opt", "gpt_neo"):
                ffn = 4 * hidden
            else:
                ffn = 0
        experts = int(_one(cfg, _EXPERTS) or 0)
        top_k = int(_one(cfg, _TOP_K) or 0) if experts else 0
        moe_ffn = int(_one(cfg, _MOE_FFN) or (ffn if experts else 0))
        if model_type in _FFN_SIZED_MOE and experts:
            moe_ffn = int(ffn)
        moe_layers = _count_moe_layers(cfg, layers, experts)
        vocab = need(_VOCAB, "vocabulary size")
        return cls(
            model_type=model_type,
            hidden=hidden,
            layers=layers,
            heads=heads,
            kv_heads=int(kv_heads),
            head_dim=int(head_dim),
            ffn=int(ffn),
            vocab=vocab,
            experts=experts,
            top_k=top_k,
            shared_experts=int(_one(cfg, _SHARED) or 0) if experts else 0,
            moe_ffn=moe_ffn,
            moe_layers=moe_layers,
            kv_lora_rank=int(cfg.get("kv_lora_rank") or 0),
            qk_rope_head_dim=int(cfg.get("qk_rope_head_dim") or 0),
            qk_nope_head_dim=int(cfg.get("qk_nope_head_dim") or 0),
            v_head_dim=int(cfg.get("v_head_dim") or 0),
            q_lora_rank=int(cfg.get("q_lora_rank") or 0),
            shared_expert_ffn=_shared_expert_ffn(cfg, experts, moe_ffn),
            tie_word_embeddings=_tied(config, cfg, model_type),
            o_groups=int(cfg.get("o_groups") or 0),
            mamba_heads=int(cfg.get("mamba_num_heads") or 0) if block_types is not None else 0,
            mamba_groups=int(cfg.get("n_groups") or 0) if block_types is not None else 0,
        )


# Families whose transformers config class ties the LM head to the embedding by default.
_TIED_BY_DEFAULT = frozenset({
    "gpt2", "opt", "bloom", "gemma", "gemma2", "gemma3", "gemma3_text", "gpt_neo", "xglm",
})


def _tied(config: Mapping[str, Any], cfg: Mapping[str, Any], model_type: str) -> bool:
    """``tie_word_embeddings`` as transformers reads it: the text config, then the top level,
    then the family's default."""
    for source in (cfg, config):
        value = source.get("tie_word_embeddings")
        if value is not None:
            return bool(value)
    inner_type = str(cfg.get("model_type") or model_type)
    return inner_type in _TIED_BY_DEFAULT or model_type in _TIED_BY_DEFAULT


def _shared_expert_ffn(cfg: Mapping[str, Any], experts: int, moe_ffn: int) -> int:
    """Combined width of the shared experts every token passes through (0 without MoE)."""
    if not experts:
        return 0
    if str(cfg.get("model_type") or "") in _FFN_SIZED_MOE:
        return int(cfg.get("intermediate_size") or moe_ffn)
    for key in ("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size"):
        if cfg.get(key):
            return int(cfg[key])
    shared = int(_one(cfg, _SHARED) or 0)
    if shared:
        return shared * moe_ffn
    if str(cfg.get("model_type") or "").startswith("llama4"):
        return int(cfg.get("intermediate_size") or moe_ffn)  # one shared expert per MoE layer
    return 0


_PATTERN_TYPES = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


def ernie_moe_layers(cfg: Mapping[str, Any], layers: int) -> set[int]:
    """ERNIE 4.5's MoE layers: every ``moe_layer_interval``-th layer from
    ``moe_layer_start_index`` to ``moe_layer_end_index`` (inclusive; transformers'
    ``Ernie4_5_MoeDecoderLayer``)."""
    start = int(cfg.get("moe_layer_start_index") or 0)
    end = cfg.get("moe_layer_end_index")
    end = layers - 1 if end is None or int(end) < 0 else int(end)
    interval = int(cfg.get("moe_layer_interval") or 1)
    return {i for i in range(layers) if (i + 1) % interval == 0 and start <= i <= end}


def _block_types(cfg: Mapping[str, Any]) -> list[str] | None:
    """nemotron_h's per-layer block types, from ``hybrid_override_pattern`` ("M" mamba,
    "*" attention, "-" MLP, "E" MoE) or the ``layers_block_type`` list transformers saves."""
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str):
        return [_PATTERN_TYPES.get(c, c) for c in pattern]
    types = cfg.get("layers_block_type")
    if isinstance(types, list | tuple):  # a tuple once a validation record froze it
        return ["moe" if t == "moe" else str(t) for t in types]
    return None


def _count_moe_layers(cfg: Mapping[str, Any], layers: int, experts: int) -> int:
    """Which layers route to experts, by the conventions each family uses."""
    if not experts:
        return 0
    block_types = _block_types(cfg)
    if block_types is not None:  # nemotron_h
        return sum(1 for t in block_types if t == "moe")
    layer_types = cfg.get("mlp_layer_types")
    if isinstance(layer_types, list | tuple):
        return sum(1 for t in layer_types if "moe" in str(t).lower() or "sparse" in str(t).lower())
    if cfg.get("first_k_dense_replace") is not None:  # deepseek
        first = int(cfg["first_k_dense_replace"])
        freq = int(cfg.get("moe_layer_freq") or 1)
        return sum(1 for i in range(first, layers) if i % freq == 0)
    if cfg.get("moe_layer_start_index") is not None:  # ernie4_5_moe
        return len(ernie_moe_layers(cfg, layers))
    mlp_only = set(cfg.get("mlp_only_layers") or ())
    step = int(cfg.get("decoder_sparse_step") or 1)  # qwen2/3 moe
    interleave = int(cfg.get("interleave_moe_layer_step") or 1)  # llama4
    if cfg.get("interleave_moe_layer_step") is not None:
        return sum(1 for i in range(layers) if (i + 1) % interleave == 0)
    return sum(1 for i in range(layers) if i not in mlp_only and (i + 1) % step == 0)
