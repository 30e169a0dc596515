"""Multi-head latent attention as production engines run it (DeepSeek-V2, V3, V3.2, Kimi K2).

transformers 5.23 caches MLA's compressed latent but re-expands the *whole* cache through
``kv_b_proj`` at every decode step (``expand_kv``) and then runs ordinary multi-head
attention over 128 heads of 192/128 channels: for DeepSeek-V3 at 4K context that is ~90×
the FLOPs of the kernel DeepSeek, vLLM and SGLang run. Inside :func:`mla_context` the
attention module's ``forward`` is replaced (on the class, restored on exit) by one that
chooses between MLA's two forms as those engines do:

- **expanded** (compute-friendly, vLLM's "prefill" path): the latent goes through
  ``kv_b_proj`` into per-head K/V and the harness's ``zrt.attention`` runs MHA with
  ``qk = nope + rope`` and ``v = v_head_dim`` channels (FlashAttention);
- **absorbed** (data-movement-friendly, "decode"): ``q_nope`` is multiplied by ``W_UK``
  into the latent space, one ``deepseek::mla_attention`` node attends over the latent
  cache with ``kv_lora_rank + rope`` channels for scores and ``kv_lora_rank`` for values
  (FlashMLA), and the output goes through ``W_UV``. ``kv_b_proj``'s weights are applied
  once per *query* token, never to the cache.

The choice is whichever needs fewer FLOPs for the call at hand (:func:`absorb_is_cheaper`):
every decode step (one query over a cached prefix) is absorbed, a prefill without a cached
prefix never is, which is exactly the prefill/decode split of vLLM's ``MLACommonImpl`` and
of DeepSeek's inference code (``attn_impl="absorb"`` caches ``kv_cache`` + ``pe_cache``).
Training has no cache and runs the expanded form, as Megatron-style MLA training does.

DeepSeek-V3.2 (DSA) adds the lightning indexer (``deepseek::lightning_indexer``, run on
every call as the model does, without gradients) and attends to the top ``index_topk``
keys in MLA's MQA (absorbed) form — the form DeepSeek built DSA on ("we implement DSA based
on the MQA mode of MLA", DeepSeek-V3.2 report §2; FlashMLA ``flash_mla_sparse_fwd`` for
prefill and training, ``flash_mla_with_kvcache`` with indices for decode; vLLM
``FlashMLASparseBackend``). A prefill that no query can take more than ``index_topk`` keys
of (``seq_len <= index_topk``, no prefix) is dense attention either way; it runs the
expanded masked-MHA form, as the report prescribes for short prefills and SGLang's NSA
backend does.

The cache holds one row per token: the ``kv_lora_rank`` normalised latent and the
``qk_rope_head_dim`` rotated key (576 values for V3, FlashMLA's ``kv_c_and_k_pe`` layout),
stored as the layer's key tensor with a zero-width value tensor beside it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from attrs import frozen

from zrt_deepseek.ops import ensure_ops

MLA_TYPES = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2")


@frozen
class MlaFamily:
    """Where a family's MLA attention lives and how it rotates q/k."""

    model_type: str
    module: str
    attention_class: str
    rope: Callable[[Any, Any, Any, Any], tuple[Any, Any]]
    sparse: bool = False


def _rope_v2(module: Any, q_rot: Any, k_rot: Any, position_embeddings: Any) -> tuple[Any, Any]:
    from transformers.models.deepseek_v2 import modeling_deepseek_v2 as m

    return m.apply_rotary_emb(q_rot, k_rot, position_embeddings.to(q_rot.device))


def _rope_v3(module: Any, q_rot: Any, k_rot: Any, position_embeddings: Any) -> tuple[Any, Any]:
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as m

    cos, sin = position_embeddings
    if module.config.rope_interleave:
        return m.apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin)
    return m.apply_rotary_pos_emb(q_rot, k_rot, cos, sin)


def _rope_v32(module: Any, q_rot: Any, k_rot: Any, position_embeddings: Any
              ) -> tuple[Any, Any]:
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as m

    cos, sin = position_embeddings
    return m.apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin)


FAMILIES = {
    "deepseek_v2": MlaFamily("deepseek_v2", "transformers.models.deepseek_v2.modeling_deepseek_v2",
                             "DeepseekV2Attention", _rope_v2),
    "deepseek_v3": MlaFamily("deepseek_v3", "transformers.models.deepseek_v3.modeling_deepseek_v3",
                             "DeepseekV3Attention", _rope_v3),
    "deepseek_v32": MlaFamily("deepseek_v32",
                              "transformers.models.deepseek_v32.modeling_deepseek_v32",
                              "DeepseekV32Attention", _rope_v32, sparse=True),
}
# Kimi K2 ships model_type kimi_k2 with DeepseekV3ForCausalLM; transformers builds it as V3.
FAMILIES["kimi_k2"] = FAMILIES["deepseek_v3"]


def family_of(config: Any) -> MlaFamily | None:
    return FAMILIES.get(str(getattr(config, "model_type", "")))


def applies_to(config: Any) -> bool:
    """MLA families transformers builds with one of the patched attention classes."""
    return family_of(config) is not None and bool(getattr(config, "kv_lora_rank", 0))


# -- the choice between the two forms -------------------------------------------------------


def causal_pairs(q_len: int, kv_len: int, topk: int = 0) -> int:
    from zrt_core.plugin import attention_pairs

    return attention_pairs(q_len, kv_len, is_causal=True, topk=topk)


def absorb_is_cheaper(q_len: int, kv_len: int, heads: int, kv_lora_rank: int, nope: int,
                      rope: int, v: int) -> bool:
    """Whether the absorbed form needs fewer FLOPs than re-expanding the cache.

    expanded: ``2·Skv·r·H·(nope + v)`` (``kv_b_proj`` over every cached token) plus
    ``2·H·pairs·(nope + rope + v)``; absorbed: ``2·Sq·H·r·(nope + v)`` (``W_UK`` into the
    query, ``W_UV`` out of the output) plus ``2·H·pairs·(r + rope + r)``.
    """
    pairs = causal_pairs(q_len, kv_len)
    expanded = 2 * kv_len * kv_lora_rank * heads * (nope + v) + 2 * heads * pairs * (
        nope + rope + v)
    absorbed = 2 * q_len * heads * kv_lora_rank * (nope + v) + 2 * heads * pairs * (
        2 * kv_lora_rank + rope)
    return absorbed < expanded


# -- the patched forward --------------------------------------------------------------------


def _cache_length(past_key_values: Any, layer_idx: int) -> int:
    if past_key_values is None:
        return 0
    return int(past_key_values.get_seq_length(layer_idx))


def _indexer_topk(module: Any, hidden_states: Any, q_resid: Any, position_embeddings: Any,
                  past_key_values: Any, start_pos: int) -> Any:
    """DeepSeek-V3.2's lightning indexer: transformers' projections, then one
    ``deepseek::lightning_indexer`` node for the scoring and top-k."""
    import torch
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as m

    idx = module.indexer
    b, s, _ = hidden_states.shape
    with torch.no_grad():
        cos, sin = position_embeddings
        q = idx.wq_b(q_resid).view(b, s, idx.n_heads, idx.head_dim)
        q_rot, q_pass = torch.split(q, [idx.qk_rope_head_dim, idx.head_dim - idx.qk_rope_head_dim],
                                    dim=-1)
        k = idx.k_norm(idx.wk(hidden_states)).unsqueeze(2)
        k_rot, k_pass = torch.split(k, [idx.qk_rope_head_dim, idx.head_dim - idx.qk_rope_head_dim],
                                    dim=-1)
        q_rot, k_rot = m.apply_rotary_pos_emb(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
        q = torch.cat([q_rot, q_pass], dim=-1)
        k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
        if past_key_values is not None:
            k = past_key_values.update_indexer(k, module.layer_idx)
        weights = idx.weights_proj(hidden_states.to(idx.weights_proj.weight.dtype)).float() \
            * (idx.n_heads ** -0.5)
        return torch.ops.deepseek.lightning_indexer(q, k, weights, int(idx.index_topk), 1,
                                                    start_pos, float(idx.softmax_scale))


def _attention_interface(family: MlaFamily, implementation: str) -> Callable[..., Any]:
    """The attention function transformers would call (the family's eager one by default)."""
    import importlib
    import sys

    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    # the modeling module is imported by the time its attention runs; sys.modules keeps
    # this traceable by torch.compile (graph mode), which skips importlib
    module = sys.modules.get(family.module) or importlib.import_module(family.module)
    eager = module.eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager)


def mla_forward(family: MlaFamily) -> Callable[..., Any]:
    """The replacement ``forward`` of ``family``'s attention class."""

    def forward(self: Any, hidden_states: Any, position_embeddings: Any = None,
                attention_mask: Any = None, past_key_values: Any = None, **kwargs: Any
                ) -> tuple[Any, Any]:
        import torch

        from zrt_core.plugin import annotate, take_cache

        # 5.24 passes the cache as ``cache=``, 5.23 and earlier as ``past_key_values=``
        past_key_values = take_cache(kwargs, past_key_values)
        kwargs.pop("position_ids", None)
        b, s = hidden_states.shape[:-1]
        heads, nope, rope = self.num_heads, self.qk_nope_head_dim, self.qk_rope_head_dim
        rank, v_dim = self.kv_lora_rank, self.v_head_dim

        q_resid = None
        if self.q_lora_rank is None:
            q = self.q_proj(hidden_states)
        else:
            q_resid = self.q_a_layernorm(self.q_a_proj(hidden_states))
            q = self.q_b_proj(q_resid)
        q = q.view(b, s, -1, self.qk_head_dim).transpose(1, 2)
        q_nope, q_rot = torch.split(q, [nope, rope], dim=-1)

        compressed = self.kv_a_proj_with_mqa(hidden_states)
        kv_nope, k_rot = torch.split(compressed, [rank, rope], dim=-1)
        kv_nope = self.kv_a_layernorm(kv_nope).view(b, 1, s, rank)
        k_rot = k_rot.view(b, 1, s, rope)
        q_rot, k_rot = family.rope(self, q_rot, k_rot, position_embeddings)

        # One cache row per token: latent then rope (FlashMLA's kv_c_and_k_pe layout).
        past = _cache_length(past_key_values, self.layer_idx)
        latent = torch.cat([kv_nope, k_rot], dim=-1)
        if past_key_values is not None:
            latent, _ = past_key_values.update(latent, latent.new_empty((b, 1, s, 0)),
                                               self.layer_idx)
        kv_len = latent.shape[2]

        indices = None
        if family.sparse:
            indices = _indexer_topk(self, hidden_states, q_resid, position_embeddings,
                                    past_key_values, kv_len - s)
            topk = int(self.indexer.index_topk)
            absorbed = past > 0 or s > topk
        else:
            absorbed = absorb_is_cheaper(s, kv_len, heads, rank, nope, rope, v_dim)

        if not absorbed:
            if past == 0:
                keys_nope, keys_rot = kv_nope, k_rot
            else:
                keys_nope, keys_rot = latent[..., :rank], latent[..., rank:]
            with annotate(mla_form="expanded"):
                key_states, value_states = self.expand_kv(keys_nope, keys_rot)
                query_states = torch.cat((q_nope, q_rot), dim=-1)
                attention = _attention_interface(family, self.config._attn_implementation)
                out, _ = attention(self, query_states, key_states, value_states, attention_mask,
                                   dropout=0.0 if not self.training else self.attention_dropout,
                                   scaling=self.scaling, **kwargs)
            out = out.reshape(b, s, -1).contiguous()
            return self.o_proj(out), None

        # Absorbed: W_UK into the query, attention over the latent cache, W_UV out.
        w = self.kv_b_proj.weight.view(heads, nope + v_dim, rank)
        w_uk, w_uv = w[:, :nope, :], w[:, nope:, :]
        row_bytes = latent.shape[-1] * latent.element_size()
        with annotate(mla_form="absorbed", kv_cache_bytes_per_token=int(row_bytes)):
            q_nope = q_nope.transpose(0, 1).reshape(heads, b * s, nope)
            q_latent = torch.bmm(q_nope, w_uk).view(heads, b, s, rank).transpose(0, 1)
            query = torch.cat([q_latent, q_rot], dim=-1)                 # [B, H, S, r + rope]
            out, _lse = torch.ops.deepseek.mla_attention(query, latent, latent[..., :rank],
                                                         indices, True, float(self.scaling))
            out = out.permute(2, 0, 1, 3).reshape(heads, b * s, rank)   # [H, B·S, r]
            out = torch.bmm(out, w_uv.transpose(1, 2))                   # [H, B·S, v]
        out = out.view(heads, b, s, v_dim).permute(1, 2, 0, 3).reshape(b, s, heads * v_dim)
        return self.o_proj(out), None

    forward.__name__ = "forward"
    forward.__qualname__ = f"{family.attention_class}.forward (zrt_deepseek)"
    return forward


@contextlib.contextmanager
def mla_context(config: Any, _options: Any) -> Iterator[None]:
    """Swap the family's attention ``forward`` for :func:`mla_forward` while open."""
    import importlib

    family = family_of(config)
    if family is None:  # applies_to said yes; the config changed under us
        yield
        return
    ensure_ops()
    cls = getattr(importlib.import_module(family.module), family.attention_class)
    original = cls.__dict__["forward"]
    cls.forward = mla_forward(family)
    try:
        yield
    finally:
        cls.forward = original
