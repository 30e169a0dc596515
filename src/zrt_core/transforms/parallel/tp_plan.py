"""The tensor-parallel plan: which weights are column-, row- or vocabulary-parallel, from the
config's ``base_model_tp_plan`` and module-name rules.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from attrs import field, frozen

if TYPE_CHECKING:
    pass


# -- the tensor-parallel plan ------------------------------------------------------------

COLWISE, ROWWISE, VOCAB, REPLICATED = "colwise", "rowwise", "vocab", "replicated"

_NAME_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    # every rank computes a shared key cache in full (vLLM's ReplicatedLinear): V4's KV
    # compressors and the DSA / CSA lightning indexers (V3.2, V4), whatever their
    # projections are called (q_b_proj, gate_proj inside them stay whole)
    (re.compile(r"(^|\.)(compressor|indexer)(\.|$)"), REPLICATED),
    (re.compile(r"(^|\.)(embed_tokens|wte|word_embeddings|embed_in|tok_embeddings|"
                r"embeddings)$"), VOCAB),
    (re.compile(r"(^|\.)(lm_head|embed_out)$"), COLWISE),
    # o_a_proj: DeepSeek-V4's grouped output projection, column-parallel over its groups
    # (vLLM's wo_a, n_local_groups = o_groups / tp); in_proj, conv1d and the per-head
    # A_log / D / dt_bias and gated norm: a Mamba-2 mixer split by heads (Megatron's
    # MambaMixer, vLLM's MambaMixer2); sinks: per-head attention sinks (GPT-OSS, V4)
    (re.compile(r"(^|\.)(q_proj|k_proj|v_proj|q_b_proj|kv_b_proj|query|key|value|qkv_proj|"
                r"c_attn|query_key_value|W_pack|Wqkv|gate_proj|up_proj|gate_up_proj|c_fc|"
                r"fc1|fc_in|dense_h_to_4h|w1|w3|wi|wi_0|wi_1|o_a_proj|in_proj|"
                r"mixer\.conv1d|mixer\.norm|A_log|D|dt_bias|sinks)$"), COLWISE),
    (re.compile(r"(^|\.)(o_proj|out_proj|c_proj|down_proj|fc2|fc_out|dense_4h_to_h|w2|wo|"
                r"o_b_proj|self_attention\.dense|attention\.dense)$"), ROWWISE),
)
_KV_PROJ = re.compile(r"(^|\.)(k_proj|v_proj|key|value)$")
_ROUTER = re.compile(r"(Router|TopK|Gate)$")


def _style(value: str) -> tuple[str, bool]:
    s = value.lower()
    packed = "packed" in s
    if s.startswith("embedding"):  # nemotron_h's "embedding_rowwise": the vocabulary rows
        return VOCAB, False
    if "colwise" in s:
        return COLWISE, packed
    if "rowwise" in s:
        return ROWWISE, packed
    return REPLICATED, False


@frozen
class TPPlan:
    """Which weights tensor parallelism splits and how.

    :param entries: ``(pattern, style)`` from a config's ``base_model_tp_plan``
        (``"layers.*.self_attn.q_proj": "colwise"``); a pattern matches the end of a
        module path or parameter name, ``*`` one path component.
    :param source: where the plan came from, for reports.
    """

    entries: tuple[tuple[str, str], ...] = field(default=(), converter=tuple)
    source: str = "module-name rules"

    @classmethod
    def from_mapping(cls, plan: Mapping[str, str] | None, source: str = "") -> TPPlan:
        if not plan:
            return cls()
        return cls(entries=tuple((str(k), str(v)) for k, v in plan.items()),
                   source=source or "config base_model_tp_plan")

    def _compiled(self) -> list[tuple[re.Pattern[str], str, bool]]:
        cached = _PLAN_CACHE.get(self.entries)
        if cached is None:
            cached = []
            for pattern, style in self.entries:
                rx = re.escape(pattern).replace(r"\*", r"[^.]+")
                kind, packed = _style(style)
                cached.append((re.compile(rf"(^|\.){rx}$"), kind, packed))
            _PLAN_CACHE[self.entries] = cached
        return cached

    def style_of(self, param: str) -> tuple[str, bool] | None:
        """``(style, packed)`` for a parameter name, or None when nothing splits it."""
        module, _, leaf = param.rpartition(".")
        for rx, kind, packed in self._compiled():
            if rx.search(module) or rx.search(param):
                return (None if kind == REPLICATED else (kind, packed))
        for rx, kind in _NAME_RULES:
            if rx.search(module):
                return None if kind == REPLICATED else (kind, False)
            if leaf not in ("weight", "bias") and rx.search(param):
                return None if kind == REPLICATED else (kind, leaf == "gate_up_proj")
        return None


_PLAN_CACHE: dict[tuple[tuple[str, str], ...], list[tuple[re.Pattern[str], str, bool]]] = {}
