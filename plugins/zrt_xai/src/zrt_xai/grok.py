"""Grok-1 (``xai-org/grok-1``, ``model.py``) written with transformers' building blocks.

What the published JAX model does, and where it lives here:

- ``LanguageModel``: token embedding × ``embedding_multiplier_scale`` (78.38 = √6144), the
  decoder stack, a final RMSNorm, logits from the *same* embedding matrix
  (``InOutEmbed.decode``: tied) × ``output_multiplier_scale`` (0.577).
- ``DecoderLayer``: sandwich norms — ``h += norm(attn(norm(h)))``, then
  ``h += norm(moe(norm(h)))``: four RMSNorms (eps 1e-5) per layer.
- ``MultiHeadAttention``: 48 query heads, 8 KV heads of 128 (GQA), rotary embeddings
  (base 10⁴) on the whole head, logits × ``attn_output_multiplier`` (0.0884 = 128^-½) and
  capped by ``30·tanh(x/30)``, softmax in fp32.
- ``MoELayer`` with ``Router``: a linear router to 8 experts, softmax in fp32, top-2, the two
  probabilities weighting the experts as they are (no renormalisation); each expert is a
  ``DenseBlock``: ``linear_1(gelu(linear(x)) · linear_v(x))`` with
  ``ffn_size(6144, 8) = 32768`` (``int(8·6144)·2//3`` rounded up to a multiple of 8).

The experts are transformers' ``MixtralExperts`` (the ``ExpertsInterface`` zrt's balanced
routing plugs into) with ``hidden_act="gelu_pytorch_tanh"`` (JAX's ``gelu`` is the tanh
approximation); attention goes through ``ALL_ATTENTION_FUNCTIONS`` with ``scaling`` and
``softcap``, as Gemma 2 passes them.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import torch
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers.cache_utils import DynamicCache
from transformers.configuration_utils import PreTrainedConfig
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_causal_mask
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.modeling_rope_utils import RopeParameters
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward
from transformers.models.mixtral.modeling_mixtral import (
    MixtralExperts,
    MixtralRMSNorm,
    MixtralRotaryEmbedding,
    apply_rotary_pos_emb,
)


def ffn_size(emb_size: int, widening_factor: float) -> int:
    """Grok-1's expert width (``model.py``): ``int(w·d)·2//3``, up to a multiple of 8.

    >>> ffn_size(6144, 8)
    32768
    """
    size = int(widening_factor * emb_size) * 2 // 3
    return size + (8 - size) % 8


@strict
class GrokConfig(PreTrainedConfig):
    """Grok-1's configuration (defaults: the released model, ``run.py``)."""

    model_type = "grok-1"
    default_theta = 10000.0  # RotaryEmbedding(base_exponent=int(1e4))
    attribute_map: ClassVar[dict[str, str]] = {"num_experts": "num_local_experts"}
    vocab_size: int = 131072
    hidden_size: int = 6144
    intermediate_size: int = 32768
    num_hidden_layers: int = 64
    num_attention_heads: int = 48
    num_key_value_heads: int = 8
    head_dim: int = 128
    hidden_act: str = "gelu_pytorch_tanh"
    max_position_embeddings: int = 8192
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-5
    use_cache: bool = True
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    tie_word_embeddings: bool = True
    attention_dropout: float | int = 0.0
    num_experts_per_tok: int = 2
    num_local_experts: int = 8
    attn_output_multiplier: float = 0.08838834764831845
    attn_logit_softcapping: float = 30.0
    embedding_multiplier_scale: float = 78.38367176906169
    output_multiplier_scale: float = 0.5773502691896257
    rope_parameters: RopeParameters | dict | None = None


class GrokRouter(nn.Module):
    """``Router``: linear to the experts, fp32 softmax, top-k probabilities as weights."""

    def __init__(self, config: GrokConfig) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.weight = nn.Parameter(torch.empty(config.num_local_experts, config.hidden_size))

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = nn.functional.linear(hidden, self.weight)
        probs = torch.softmax(logits.float(), dim=-1)
        weights, index = torch.topk(probs, self.top_k, dim=-1)
        return weights.to(hidden.dtype), index


class GrokMoE(nn.Module):
    """``MoELayer``: the router, then the routed GeGLU experts."""

    def __init__(self, config: GrokConfig) -> None:
        super().__init__()
        self.gate = GrokRouter(config)
        self.experts = MixtralExperts(config)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shape = hidden_states.shape
        flat = hidden_states.reshape(-1, shape[-1])
        weights, index = self.gate(flat)
        return self.experts(flat, index, weights).reshape(shape)


class GrokAttention(nn.Module):
    """``MultiHeadAttention``: GQA with rotary embeddings and tanh-capped logits."""

    def __init__(self, config: GrokConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = config.attn_output_multiplier
        self.softcap = config.attn_logit_softcapping
        self.is_causal = True
        self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.head_dim,
                                bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim,
                                bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim,
                                bias=False)
        self.o_proj = nn.Linear(config.num_attention_heads * self.head_dim, config.hidden_size,
                                bias=False)

    def forward(self, hidden_states: torch.Tensor, position_embeddings: Any,
                attention_mask: Any, cache: Any = None, **kwargs: Any) -> torch.Tensor:
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        cos, sin = position_embeddings
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        attend = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation,
                                                       eager_attention_forward)
        out, _ = attend(self, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling,
                        softcap=self.softcap, **kwargs)
        return self.o_proj(out.reshape(*hidden_states.shape[:-1], -1).contiguous())


class GrokDecoderLayer(nn.Module):
    """``DecoderLayer``: attention and MoE each between two RMSNorms (sandwich norms)."""

    def __init__(self, config: GrokConfig, layer_idx: int) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.self_attn = GrokAttention(config, layer_idx)
        self.mlp = GrokMoE(config)
        self.input_layernorm = MixtralRMSNorm(config.hidden_size, eps=eps)
        self.post_attention_layernorm = MixtralRMSNorm(config.hidden_size, eps=eps)
        self.pre_feedforward_layernorm = MixtralRMSNorm(config.hidden_size, eps=eps)
        self.post_feedforward_layernorm = MixtralRMSNorm(config.hidden_size, eps=eps)

    def forward(self, hidden_states: torch.Tensor, *, position_embeddings: Any,
                attention_mask: Any, cache: Any = None, **kwargs: Any) -> torch.Tensor:
        attn = self.self_attn(self.input_layernorm(hidden_states), position_embeddings,
                              attention_mask, cache=cache, **kwargs)
        hidden_states = hidden_states + self.post_attention_layernorm(attn)
        moe = self.mlp(self.pre_feedforward_layernorm(hidden_states))
        return hidden_states + self.post_feedforward_layernorm(moe)


class GrokPreTrainedModel(PreTrainedModel):
    config_class = GrokConfig
    config: GrokConfig
    base_model_prefix = "model"
    _no_split_modules: ClassVar[list[str]] = ["GrokDecoderLayer"]
    _supports_attention_backend = True
    _supports_sdpa = True
    _supports_flash_attn = True


def _cache_field(output_type: Any) -> str:
    """The output field that carries the cache: ``cache`` (transformers 5.24+) or
    ``past_key_values``."""
    return "cache" if "cache" in getattr(output_type, "__dataclass_fields__", {}) \
        else "past_key_values"


def _mask_kwargs(cache: Any) -> dict[str, Any]:
    name = "cache" if "cache" in inspect.signature(create_causal_mask).parameters \
        else "past_key_values"
    return {name: cache}


class GrokModel(GrokPreTrainedModel):
    """The decoder stack between the scaled embedding and the final RMSNorm."""

    def __init__(self, config: GrokConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size,
                                         config.pad_token_id)
        self.layers = nn.ModuleList(GrokDecoderLayer(config, i)
                                    for i in range(config.num_hidden_layers))
        self.norm = MixtralRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = MixtralRotaryEmbedding(config=config)
        self.post_init()

    def forward(self, input_ids: torch.Tensor, *, attention_mask: Any = None,
                position_ids: Any = None, cache: Any = None, use_cache: bool | None = None,
                **kwargs: Any) -> tuple[torch.Tensor, Any]:
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        hidden = self.embed_tokens(input_ids) * self.config.embedding_multiplier_scale
        if position_ids is None:
            seen = cache.get_seq_length() if cache is not None else 0
            position_ids = torch.arange(hidden.shape[1], device=hidden.device)[None] + seen
        mask = create_causal_mask(config=self.config, inputs_embeds=hidden,
                                  attention_mask=attention_mask, position_ids=position_ids,
                                  **_mask_kwargs(cache))
        position_embeddings = self.rotary_emb(hidden, position_ids=position_ids)
        for layer in self.layers:
            hidden = layer(hidden, position_embeddings=position_embeddings,
                           attention_mask=mask, cache=cache, **kwargs)
        return self.norm(hidden), cache


class GrokForCausalLM(GrokPreTrainedModel, GenerationMixin):
    """``LanguageModel``: logits from the tied embedding, × ``output_multiplier_scale``."""

    _tied_weights_keys: ClassVar[dict[str, str]] = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: GrokConfig) -> None:
        super().__init__(config)
        self.model = GrokModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(self, input_ids: torch.Tensor, *, attention_mask: Any = None,
                position_ids: Any = None, cache: Any = None, use_cache: bool | None = None,
                labels: torch.Tensor | None = None, logits_to_keep: int = 0,
                **kwargs: Any) -> CausalLMOutputWithPast:
        hidden, cache = self.model(input_ids, attention_mask=attention_mask,
                                   position_ids=position_ids, cache=cache,
                                   use_cache=use_cache, **kwargs)
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:, :]
        logits = self.lm_head(hidden) * self.config.output_multiplier_scale
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels,
                                      vocab_size=self.config.vocab_size)
        return CausalLMOutputWithPast(loss=loss, logits=logits,
                                      **{_cache_field(CausalLMOutputWithPast): cache})
