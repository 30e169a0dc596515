"""Analytic reference counts: parameters and forward/backward FLOPs per phase.

These are the numbers a captured graph is checked against (a gap over 10% is reported),
computed from the config alone. Pure functions of an :class:`~zrt_core.modelmath.arch.
Architecture`; no torch.

Derivation (one sequence of ``S`` tokens; a multiply-add is 2 FLOPs)::

    matmul     = 2 · N_active · T                T tokens through the layers; N_active the
                                                 layer matmul weights one token uses (attention
                                                 or SSM projections, dense MLP or router +
                                                 shared + top-k routed experts)
    attention  = Σ_layers Σ_queries 2·H·n·(d_qk + d_v)
                                                 n keys a query attends: QKᵀ costs 2·H·n·d_qk,
                                                 AV costs 2·H·n·d_v (GQA shares K/V heads but
                                                 every query head still does both products)
    lm_head    = 2 · hidden · vocab · positions  positions whose logits are computed

Keys per query ``n`` (query ``i`` = 1..S, causal):
    full attention ``n = i``                 → Σ = S(S+1)/2 (the lower triangle)
    sliding window W ``n = min(i, W)``       → W(W+1)/2 + (S−W)·W when S > W
    chunked (Llama 4) chunk C ``n = ((i−1) mod C) + 1``
    DeepSeek sparse attention top-k K ``n = min(i, K)``, plus the lightning indexer that
    scores every earlier key: 2·H_idx·d_idx·i for its ``q·k`` and 2·H_idx·i to weight heads.
    DSA runs in MLA's absorbed (MQA) form (d_qk = kv_lora_rank + qk_rope_head_dim,
    d_v = kv_lora_rank: FlashMLA's sparse kernels; DeepSeek-V3.2 report §2) once a
    sequence is longer than K; shorter prompts are dense either way and run masked MHA.

Phases (what production engines run):
    prefill     B·S tokens, causal, logits for the last position of each sequence only.
    decode      one new token per sequence with ``kv_len`` tokens already cached: it
                attends to ``kv_len + 1`` keys (the cache and itself). MLA decodes with the
                absorbed weights, attending over the latent cache: d_qk = kv_lora_rank +
                qk_rope_head_dim, d_v = kv_lora_rank (kv_b_proj's weights are applied once
                per token, so the matmul term stays 2·N·T).
    train_forward   B·S tokens, causal, logits for every position.
    train_backward  2 × train_forward (input and weight gradients each cost one forward).

Mamba-2 mixers (nemotron_h) add, per token, 2·kernel·conv_dim for the depthwise convolution
and 5·inner·state for the selective scan in its recurrent form (state update
``h ← exp(Δ·A)·h + Δ·B·x``: 3 per state element; output ``y = C·h``: 2). The chunked SSD
kernel used for prefill and training does about the same per token
(4·state·head_dim for the chunk states plus chunk·head_dim inside a 128-token chunk, per
head), so one formula serves all phases; it is an approximation, within a few percent of a
Mamba layer's FLOPs, which its projections dominate anyway.

Gated DeltaNet mixers (Qwen3-Next's linear attention) add the depthwise convolution,
2·kernel·conv_dim per token, and per value head (query/key heads shared across value
heads, ``d_k × d_v`` state each):
    chunked (prefill, training; chunk C = 64, the chunked kernel of flash-linear-attention
    and transformers' torch fallback): 2·(2·C·d_k + C·d_v + 3·d_k·d_v) per token — the
    in-chunk ``k_β·Kᵀ`` and ``Q·Kᵀ`` (C·d_k each), the in-chunk ``A·v_new`` (C·d_v), and
    per chunk the state read by the decayed keys and by the queries and the state update
    (d_k·d_v each, per token); the two unit-triangular solves are left out (C·d/2 each).
    recurrent (decode): 7·d_k·d_v per token — decay the state (1), read it with the key
    (2), write the rank-one update (2), read it with the query (2).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from attrs import frozen

from zrt_core.errors import ModelError
from zrt_core.modelmath.arch import (
    Architecture,
    AttentionSpec,
    DeltaNetSpec,
    MambaSpec,
    architecture,
)

if TYPE_CHECKING:
    from zrt_core.plugins import PluginHost

PHASES = ("prefill", "decode", "train_forward", "train_backward")


@frozen
class ParamCounts:
    """Parameter counts of the language model.

    :param total: every weight (``sum(p.numel())`` of the built model).
    :param active: the weights one token uses: ``total`` minus the routed experts it does
        not visit (equal to ``total`` for dense models).
    :param embedding: input embeddings (token, plus learned positions where the family has
        them).
    :param head: separate LM-head weights (0 when tied to the embedding).
    :param layer_matmul_active: matmul weights one token multiplies inside the decoder
        layers (the ``N_active`` of ``2·N_active·T``).
    :param head_matmul: the LM head's matmul weights (hidden × vocab), tied or not.
    """

    total: int
    active: int
    embedding: int
    head: int
    layer_matmul_active: int
    head_matmul: int

    def to_json(self) -> dict[str, int]:
        return {"total": self.total, "active": self.active, "embedding": self.embedding,
                "head": self.head, "layer_matmul_active": self.layer_matmul_active,
                "head_matmul": self.head_matmul}


@frozen
class PhaseFlops:
    """Analytic FLOPs of one phase for the whole model (every layer), split by source."""

    phase: str
    batch: int
    seq_len: int
    tokens: int
    matmul: int
    attention: int
    ssm: int
    lm_head: int

    @property
    def total(self) -> int:
        return self.matmul + self.attention + self.ssm + self.lm_head

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase, "batch": self.batch, "seq_len": self.seq_len,
                "tokens": self.tokens, "matmul": self.matmul, "attention": self.attention,
                "ssm": self.ssm, "lm_head": self.lm_head, "total": self.total}


def _arch(model: Architecture | Mapping[str, Any]) -> Architecture:
    return model if isinstance(model, Architecture) else architecture(model)


def param_counts(model: Architecture | Mapping[str, Any]) -> ParamCounts:
    """Parameter counts from an architecture or a config mapping."""
    arch = _arch(model)
    layers_total = sum(layer.total_params for layer in arch.layers)
    unused_experts = sum(layer.expert_params - layer.active_expert_params
                         for layer in arch.layers)
    head = 0 if arch.tied_head else arch.head_params
    total = arch.embedding_params + layers_total + arch.other_params + head
    return ParamCounts(
        total=total,
        active=total - unused_experts,
        embedding=arch.embedding_params,
        head=head,
        layer_matmul_active=sum(layer.active_matmul_params for layer in arch.layers),
        head_matmul=arch.head_params,
    )


# -- keys per query ---------------------------------------------------------------------


def causal_keys(seq_len: int, *, window: int | None = None, chunk: int | None = None) -> int:
    """Σ over queries 1..S of the keys each attends (see the module docstring)."""
    s = seq_len
    if chunk:
        full_chunks, rest = divmod(s, chunk)
        return full_chunks * chunk * (chunk + 1) // 2 + rest * (rest + 1) // 2
    if window and s > window:
        return window * (window + 1) // 2 + (s - window) * window
    return s * (s + 1) // 2


def decode_keys(kv_len: int, *, window: int | None = None, chunk: int | None = None) -> int:
    """Keys the new token attends with ``kv_len`` tokens cached (itself included)."""
    if chunk:
        return kv_len % chunk + 1
    n = kv_len + 1
    return min(n, window) if window else n


def _attention_prefill(a: AttentionSpec, seq_len: int) -> int:
    """Attention FLOPs of one causal sequence of ``seq_len`` queries in one layer."""
    limit = a.sparse_topk if a.sparse_topk else a.window
    keys = causal_keys(seq_len, window=limit, chunk=a.chunk)
    qk, v = a.qk_dim, a.v_dim
    if a.sparse_topk and a.decode_qk_dim and seq_len > a.sparse_topk:
        qk, v = a.decode_qk_dim, a.decode_v_dim  # DSA in MLA's MQA form (docstring)
    flops = 2 * a.heads * keys * (qk + v)
    if a.indexer_heads:
        all_keys = causal_keys(seq_len)
        flops += 2 * a.indexer_heads * all_keys * (a.indexer_dim + 1)
    return flops


def _attention_decode(a: AttentionSpec, kv_len: int) -> int:
    """Attention FLOPs of one new token with ``kv_len`` cached keys in one layer."""
    limit = a.sparse_topk if a.sparse_topk else a.window
    keys = decode_keys(kv_len, window=limit, chunk=a.chunk)
    qk = a.decode_qk_dim or a.qk_dim
    v = a.decode_v_dim or a.v_dim
    flops = 2 * a.heads * keys * (qk + v)
    if a.indexer_heads:
        flops += 2 * a.indexer_heads * (kv_len + 1) * (a.indexer_dim + 1)
    return flops


def _ssm_per_token(m: MambaSpec) -> int:
    return 2 * m.conv_kernel * m.conv_dim + 5 * m.inner * m.state


#: Tokens per chunk of the chunked Gated DeltaNet kernel (flash-linear-attention's
#: ``chunk_gated_delta_rule`` and transformers' ``torch_chunk_gated_delta_rule``).
DELTANET_CHUNK = 64


def _delta_per_token(m: DeltaNetSpec, *, recurrent: bool) -> int:
    conv = 2 * m.conv_kernel * m.conv_dim
    if recurrent:
        return conv + 7 * m.v_heads * m.k_dim * m.v_dim
    c = DELTANET_CHUNK
    return conv + 2 * m.v_heads * (2 * c * m.k_dim + c * m.v_dim + 3 * m.k_dim * m.v_dim)


def _mixer_state_per_token(arch: Architecture, *, recurrent: bool) -> int:
    """State-space and linear-attention FLOPs per token over all layers."""
    return sum(_ssm_per_token(layer.mamba) for layer in arch.layers
               if layer.mamba is not None) + \
        sum(_delta_per_token(layer.delta, recurrent=recurrent) for layer in arch.layers
            if layer.delta is not None)


# -- phases -----------------------------------------------------------------------------


def _check(batch: int, seq_len: int) -> None:
    for name, value in (("batch", batch), ("sequence length", seq_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ModelError(f"{name} must be a positive integer, got {value!r}")


def prefill_flops(model: Architecture | Mapping[str, Any], batch: int, seq_len: int
                  ) -> PhaseFlops:
    """Prefill of ``batch`` sequences of ``seq_len`` tokens; logits for the last token."""
    return _forward(_arch(model), "prefill", batch, seq_len, logits_per_sequence=1)


def train_forward_flops(model: Architecture | Mapping[str, Any], batch: int, seq_len: int
                        ) -> PhaseFlops:
    """Training forward: causal over ``seq_len``, logits for every position."""
    return _forward(_arch(model), "train_forward", batch, seq_len, logits_per_sequence=seq_len)


def train_backward_flops(model: Architecture | Mapping[str, Any], batch: int, seq_len: int
                         ) -> PhaseFlops:
    """Training backward: twice the training forward, term by term."""
    f = train_forward_flops(model, batch, seq_len)
    return PhaseFlops(phase="train_backward", batch=batch, seq_len=seq_len, tokens=f.tokens,
                      matmul=2 * f.matmul, attention=2 * f.attention, ssm=2 * f.ssm,
                      lm_head=2 * f.lm_head)


def decode_flops(model: Architecture | Mapping[str, Any], batch: int, kv_len: int
                 ) -> PhaseFlops:
    """One decode step: ``batch`` new tokens, each with ``kv_len`` tokens cached."""
    _check(batch, kv_len)
    arch = _arch(model)
    counts = param_counts(arch)
    attention = sum(_attention_decode(layer.attention, kv_len)
                    for layer in arch.layers if layer.attention is not None)
    ssm = _mixer_state_per_token(arch, recurrent=True)
    return PhaseFlops(
        phase="decode", batch=batch, seq_len=kv_len, tokens=batch,
        matmul=2 * counts.layer_matmul_active * batch,
        attention=batch * attention,
        ssm=batch * ssm,
        lm_head=2 * counts.head_matmul * batch,
    )


def _forward(arch: Architecture, phase: str, batch: int, seq_len: int, *,
             logits_per_sequence: int) -> PhaseFlops:
    _check(batch, seq_len)
    counts = param_counts(arch)
    tokens = batch * seq_len
    attention = sum(_attention_prefill(layer.attention, seq_len)
                    for layer in arch.layers if layer.attention is not None)
    ssm = _mixer_state_per_token(arch, recurrent=False)
    return PhaseFlops(
        phase=phase, batch=batch, seq_len=seq_len, tokens=tokens,
        matmul=2 * counts.layer_matmul_active * tokens,
        attention=batch * attention,
        ssm=tokens * ssm,
        lm_head=2 * counts.head_matmul * batch * logits_per_sequence,
    )


def phase_flops(model: Architecture | Mapping[str, Any], phase: str, batch: int,
                seq_len: int) -> PhaseFlops:
    """Analytic FLOPs of ``phase``; for decode ``seq_len`` is the cached length."""
    if phase == "prefill":
        return prefill_flops(model, batch, seq_len)
    if phase == "decode":
        return decode_flops(model, batch, seq_len)
    if phase == "train_forward":
        return train_forward_flops(model, batch, seq_len)
    if phase == "train_backward":
        return train_backward_flops(model, batch, seq_len)
    raise ModelError(f"unknown phase {phase!r}", f"use one of {', '.join(PHASES)}")


#: The source ``reference_flops`` names for the core's own count.
CORE_REFERENCE = "zrt-core"


def reference_flops(config: Mapping[str, Any], phase: str, batch: int, seq_len: int, *,
                    host: PluginHost | None) -> tuple[PhaseFlops, str]:
    """The reference FLOPs of ``phase`` and where they come from: the core's count
    (:func:`phase_flops`, source ``zrt-core``) for the families it describes, else the
    first installed plugin's ``zrt_reference_flops`` answer (source: its distribution).

    The core is asked first so that a plugin rewriting a family's capture cannot move the
    reference that capture is checked against; plugins extend the reference to families
    the core does not describe.

    :raises ModelError: an unknown phase, or neither the core nor any plugin describes the
        model (the core's message, with a hint naming the hook).
    """
    if phase not in PHASES:
        raise ModelError(f"unknown phase {phase!r}", f"use one of {', '.join(PHASES)}")
    try:
        return phase_flops(config, phase, batch, seq_len), CORE_REFERENCE
    except ModelError as exc:
        found = host.reference_flops(config, phase, batch, seq_len) if host else None
        if found is None:
            raise ModelError(exc.message, "no installed plugin counts it either "
                             "(zrt_reference_flops); capture still works") from exc
        return found


def flops_gap(captured: float, analytic: float) -> float | None:
    """Relative gap ``(captured − analytic) / analytic``; None without an analytic count."""
    if not analytic:
        return None
    return (captured - analytic) / analytic
