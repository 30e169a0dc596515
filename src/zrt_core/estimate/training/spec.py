"""The estimator's settings: usable memory, the kernel choices, and multi-token prediction
(``MtpSpec``) read from a config.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from attrs import field, frozen

from zrt_core.checks import _mtp_layers

if TYPE_CHECKING:
    pass


#: Fraction of a device's memory a training job may fill: the rest is the CUDA context,
#: NCCL's buffers and the caching allocator's fragmentation.
USABLE_MEMORY_FRACTION = 0.95
#: Attention kernels a training estimate prices: ``flash`` the device's own fused kernel
#: (cuDNN / FlashAttention-3 on Hopper, FlashAttention-2 on Ampere), ``flash2`` / ``flash1``
#: the older FlashAttention generations PyTorch-native stacks run (at the pack's published
#: rates for them), ``unfused`` Megatron-LM's 2021-22 attention core.
ATTENTION_KERNELS = ("flash", "flash2", "flash1", "unfused")
#: The older generations' names, for notes and errors.
ATTENTION_GENERATION_NAMES = {"flash2": "FlashAttention-2", "flash1": "FlashAttention 1.x"}
CROSS_ENTROPY_KERNELS = ("fused", "megatron", "te_inplace")

#: PyTorch-native training stacks whose attention is an older FlashAttention generation than
#: the device's own kernel, by the source a record names (docs/cost-model.md, "Attention
#: kernels"):
#:
#: - MosaicML's llm-foundry (MPT): its published benchmark tables (scripts/train/benchmarking,
#:   2023-10) were run by ``submit_benchmarks.py`` with llm-foundry v0.3.0 ``pip install
#:   .[gpu]``, which pinned ``flash-attn==1.0.9`` (``flash-attn==1.0.7`` for the H100 fp8
#:   rows); the ``gpu`` extra moved to flash-attn 2 only in v0.6.0 (2024-03).
#:
#: - PyTorch's torchtitan: its SDPA wrapper (``ScaledDotProductAttention``, torchtitan
#:   ``models/attention.py`` at 9dec370, 820504e and e7c0cae, the commits its published
#:   benchmark tables ran) keeps PyTorch's own order, FlashAttention first (PyTorch's bundled
#:   FlashAttention-2; pytorch/pytorch#138907 prints the default order flash, efficient,
#:   math, cuDNN), and puts cuDNN first only on compute capability 10.0 and up
#:   (pytorch/torchtitan#1196, 2025-05); #1000 (2025-03) adds cuDNN last, under context
#:   parallelism only. cuDNN went first on every GPU only with #1776 (2025-10), after every
#:   table in its ``benchmarks/`` folder. So its tables ran FlashAttention-2 on Hopper and
#:   A100, and the device's own kernel on Blackwell (the packs there publish no FA2 rate,
#:   and the fallback below prices that).
_FOUNDRY_FA1 = "llm-foundry v0.3.0's flash-attn 1.0.x, as its benchmark tables ran"
_TORCHTITAN_FA2 = ("torchtitan's SDPA order before 2025-10, FlashAttention first: "
                   "PyTorch's bundled FlashAttention-2 below compute capability 10.0")
#: (name in the source, attention kernel, why)
ATTENTION_BY_SOURCE = (("llm-foundry", "flash1", _FOUNDRY_FA1),
                       ("MosaicML", "flash1", _FOUNDRY_FA1),
                       ("torchtitan", "flash2", _TORCHTITAN_FA2))


def source_attention(source: str, assumptions: list[str]) -> str:
    """The attention kernel of the stack a record's source names
    (:data:`ATTENTION_BY_SOURCE`), ``flash`` (the device's own) for every other source."""
    for name, kernel, why in ATTENTION_BY_SOURCE:
        if name.lower() in source.lower():
            assumptions.append(f"attention as {ATTENTION_GENERATION_NAMES[kernel]} kernels "
                               f"({why}; the device's own kernel where the hardware pack "
                               "publishes no rate for them)")
            return kernel
    return "flash"


#: Training stacks whose ``selective`` recompute is not Megatron-LM's (the attention core),
#: by the source a record names: torchtitan's ``[activation_checkpoint] mode = "selective"``
#: runs ``selective_ac_option = "op"`` in every train config its published benchmarks used
#: (``train_configs/llama3_{8b,70b,405b}.toml`` at 9dec370; the async-TP page says "per op
#: SAC"), PyTorch's checkpointing by op (:func:`zrt_core.transforms.training.recompute.
#: op_policy_saved`).
RECOMPUTE_BY_SOURCE = (("torchtitan", "op", "torchtitan's selective_ac_option 'op' (its "
                        "train configs' setting): PyTorch's checkpointing by op"),)


def source_recompute(source: str, recompute: str, assumptions: list[str]) -> str:
    """A record's ``selective`` recompute as the stack its source names runs it
    (:data:`RECOMPUTE_BY_SOURCE`); any other recompute, or source, as given."""
    if recompute != "selective":
        return recompute
    for name, mode, why in RECOMPUTE_BY_SOURCE:
        if name.lower() in source.lower():
            assumptions.append(f"recompute selective as {mode} ({why})")
            return mode
    return recompute


_GROUP_ORDER = ("tp", "etp", "cp", "ep", "pp", "dp", "dp_cp", "edp", "host", "overlap",
                "other")


def _ro(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(value or {}))


@frozen
class MtpSpec:
    """Multi-token prediction as the training recipe runs it (Megatron-Core
    ``--mtp-num-layers``): ``depths`` MTP modules, each a block of the layer ``kinds`` (empty:
    the kind of the last decoder layer, as DeepSeek's) with its own LM head and loss;
    ``shared_weights``: one block's weights at every depth (``mtp_use_repeated_layer``);
    ``bf16``: the MTP layers' linear layers stay bf16 under fp8/fp4 recipes
    (``keep_mtp_spec_in_bf16``). :func:`zrt_core.transforms.training.add_mtp_layers`."""

    depths: int
    kinds: tuple[str, ...] = field(default=(), converter=tuple)
    shared_weights: bool = False
    bf16: bool = False

    @property
    def layers(self) -> int:
        return self.depths * max(1, len(self.kinds))


#: Nemotron-H block characters (``hybrid_override_pattern``) → captured template kinds.
_NEMOTRON_KINDS = {"M": "mamba", "E": "moe", "*": "full_attention", "-": "mlp"}


def mtp_at_depths(config: Mapping[str, Any], depths: int
                  ) -> tuple[dict[str, Any], MtpSpec | None]:
    """``(config, MtpSpec)`` of a run that trains ``depths`` MTP modules (``zrt run --train
    --mtp N``, ``zrt search --mtp N``): the config with ``num_nextn_predict_layers`` (and a
    declared ``mtp_num_layers``) set to ``depths``, and the MTP it gives."""
    config = {**config, "num_nextn_predict_layers": depths}
    if "mtp_num_layers" in config:
        config["mtp_num_layers"] = depths
    return config, mtp_from_config(config)


def mtp_from_config(config: Mapping[str, Any]) -> MtpSpec | None:
    """The MTP the Megatron-Bridge recipes train with for a HF config that declares MTP
    layers (``num_nextn_predict_layers``): DeepSeek-V3/V4 one MoE block per layer declared;
    Nemotron 3 (Super, 3.5 Lightning) the ``mtp_hybrid_override_pattern`` block (``"*E"``)
    run at two depths with repeated weights and kept in bf16
    (``recipes/nemotronh``: ``mtp_num_layers = 2``, ``mtp_use_repeated_layer``,
    ``keep_mtp_spec_in_bf16``)."""
    n = _mtp_layers(config)
    if not n:
        return None
    if str(config.get("model_type")) == "nemotron_h":
        pattern = str(config.get("mtp_hybrid_override_pattern") or "*E")
        kinds = tuple(_NEMOTRON_KINDS[c] for c in pattern if c in _NEMOTRON_KINDS)
        return MtpSpec(depths=2, kinds=kinds, shared_weights=True, bf16=True)
    return MtpSpec(depths=n)
