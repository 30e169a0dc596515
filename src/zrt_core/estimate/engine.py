"""Serving-engine profiles: how much memory the KV cache gets and how large a batch the
engine runs, as each engine decides it (docs/inference-model.md cites the sources).

``trtllm`` follows ``trtllm-bench`` (TensorRT-LLM ``bench/tuning/heuristics.py``,
``calc_engine_setting`` / ``finetune_setting``): the max batch size and max number of
tokens per iteration come from a KV-capacity estimate (parameters × bytes per element,
the whole model's KV bytes per token — 2 × layers × max(tp, kv heads) × head size × KV
bytes for GQA, layers × (kv_lora_rank + rope dim) × KV bytes for MLA — plus a fixed
"extra cache" per request for hybrid Mamba models, the GPU memory fraction, squared for
hybrids), rounded up "optimistically" (exactly, to an even count, for hybrids); zrt reads
the KV bytes from the captured graph's caches; at run time the KV cache takes
``kv_cache_free_gpu_mem_fraction`` of the memory left after weights and warm-up
activations, and the capacity scheduler (GUARANTEED_NO_EVICT) admits a request only with
room for its whole input + output.

``vllm`` follows vLLM's V1 defaults for a large GPU: ``max_num_seqs`` 1024,
``max_num_batched_tokens`` 16384 (offline ``LLM`` class), ``gpu_memory_utilization`` 0.9
of the whole device for weights, activations and cache together.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from attrs import evolve, field, frozen

from zrt_core.errors import UnknownNameError

if TYPE_CHECKING:
    from zrt_core.hardware import HardwareSpec


def _ro(value: Mapping[str, float]) -> Mapping[str, float]:
    return MappingProxyType({str(k): float(v) for k, v in dict(value).items()})

GIB = 1024**3


@frozen
class EngineSettings:
    """What the engine runs with: at most ``max_batch`` sequences and ``max_num_tokens``
    tokens (prompt chunks plus one per generating sequence) per iteration."""

    max_batch: int
    max_num_tokens: int


@frozen
class EngineProfile:
    """One serving engine's memory and batching rules.

    :param kv_fraction: the KV cache's share of the memory left after weights, warm-up
        activations and the runtime reserve (trtllm); of the whole device minus weights and
        activations (vllm, ``memory_of_device`` True).
    :param runtime_reserve_gib: CUDA context, communication and library workspaces.
    :param kv_block_tokens: tokens per KV-cache block (a sequence holds whole blocks).
    :param gemm_derate: per GEMM precision (``bf16``, ``fp8``, ``fp4``, ``int8``), the
        fraction of the hardware's calibrated kernel efficiency the engine's GEMMs reach
        end to end (docs/inference-model.md gives the fit); absent means 1.
    :param chunked_prefill: prompts are split to fill every iteration's token budget
        (vLLM's default); without it (trtllm-bench's default) an iteration admits whole
        prompts only, and a prompt longer than the free budget is still split (the engine
        enables chunked context when a prompt exceeds ``max_num_tokens``).
    :param host_floor: the engine's executor does host work per scheduled request each
        iteration beside the GPU's (TensorRT-LLM's PyTorch ``PyExecutor`` with its overlap
        scheduler): an iteration takes at least the hardware's ``serving_host_request_us``
        × its requests. False for vLLM (not modelled: no published per-request figure).
    :param cuda_graph_batch_sizes: TensorRT-LLM's ``cuda_graph_config.batch_sizes`` with
        ``enable_padding``: generation-only iterations replay the captured graph of the
        next size up, padded with dummy generation requests (docs/inference-model.md,
        "CUDA-graph padding").
    :param nvls: the engine's TP all-reduce goes through NCCL, which uses NVLink SHARP where
        the pack offers it. False for both engines: TensorRT-LLM's AllReduce op runs its
        own one-shot/two-shot kernels over NVLink peer memory for messages that fit its
        workspace (``customAllReduceUtils.h``: 8 MB beyond TP 2), vLLM its
        ``custom_all_reduce`` (8 MB); larger messages go to NCCL, not modelled
        (docs/collectives.md).
    """

    name: str
    kv_fraction: float
    runtime_reserve_gib: float
    kv_block_tokens: int
    memory_of_device: bool = False
    fixed_max_batch: int = 0
    fixed_max_tokens: int = 0
    #: batch defaults by device and entry point (vLLM's ``EngineArgs.get_batch_defaults``,
    #: SGLang's chunked-prefill size by GPU memory): ``{(large device, online): (max
    #: sequences, max tokens)}``, a large device being one of at least
    #: ``batch_defaults_gib`` that is not an A100; empty: the fixed values above
    batch_defaults: Mapping[tuple[bool, bool], tuple[int, int]] = field(
        factory=dict, converter=lambda v: MappingProxyType(dict(v)))
    batch_defaults_gib: float = 0.0
    chunked_prefill: bool = True
    gemm_derate: Mapping[str, float] = field(factory=dict, converter=_ro)
    description: str = ""
    nvls: bool = False
    host_floor: bool = False
    #: the batch sizes the engine captures CUDA graphs for, with padding: a decode-only
    #: iteration runs the graph of the smallest size that holds its sequences, the rest
    #: of the rows dummy requests (:func:`cuda_graph_batch`); empty: no padding
    cuda_graph_batch_sizes: tuple[int, ...] = field(default=(), converter=tuple)

    def hardware(self, hw: HardwareSpec) -> HardwareSpec:
        """``hw`` with this engine's GEMM derates applied to its kernel efficiencies, and
        without NVLink SHARP unless the engine's all-reduce uses it."""
        if not self.nvls:
            hw = hw.without_in_network(nvls=True, sharp=False)
        if not self.gemm_derate:
            return hw
        eff = hw.efficiency
        fp8 = eff.matmul_fp8 if eff.matmul_fp8 is not None else eff.matmul
        fp4 = eff.matmul_fp4 if eff.matmul_fp4 is not None else fp8
        int8 = eff.matmul_int8 if eff.matmul_int8 is not None else fp8
        values = {"bf16": eff.matmul, "fp8": fp8, "fp4": fp4, "int8": int8}
        changes = {}
        for key, field_name in (("bf16", "matmul"), ("fp8", "matmul_fp8"),
                                ("fp4", "matmul_fp4"), ("int8", "matmul_int8")):
            if key in self.gemm_derate:
                changes[field_name] = min(1.0, values[key] * self.gemm_derate[key])
        return evolve(hw, efficiency=evolve(eff, **changes))

    def settings(self, *, total_params: int, weight_bytes_per_param: float,
                 kv_bytes_per_token_model: float, device_gib: float, tp: int, pp: int,
                 input_len: int, output_len: int, kv_extra_bytes_per_request_model: float = 0.0,
                 recurrent_state: bool = False, device: str = "",
                 online: bool = False) -> EngineSettings:
        """Max batch and max tokens per iteration (per pipeline stage for trtllm).

        :param device: the hardware id (vLLM keeps an A100's smaller defaults).
        :param online: the engine serves clients (its API server), not an offline batch.
        """
        if self.batch_defaults:
            large = device_gib >= self.batch_defaults_gib and "a100" not in device.lower()
            return EngineSettings(*self.batch_defaults[(large, online)])
        if self.fixed_max_batch:
            return EngineSettings(self.fixed_max_batch, self.fixed_max_tokens)
        return trtllm_bench_settings(
            total_params=total_params, weight_bytes_per_param=weight_bytes_per_param,
            kv_bytes_per_token_model=kv_bytes_per_token_model, device_gib=device_gib,
            gpus=tp * pp, pp=pp, input_len=input_len, output_len=output_len,
            kv_fraction=self.kv_fraction,
            extra_bytes_per_request_model=kv_extra_bytes_per_request_model,
            hybrid=recurrent_state, chunked_prefill=self.chunked_prefill)

    def graph_sizes(self, settings: EngineSettings) -> tuple[int, ...]:
        """The CUDA-graph batch sizes the engine keeps under ``settings``
        (:func:`cuda_graph_sizes`); empty where it pads nothing."""
        if not self.cuda_graph_batch_sizes:
            return ()
        return cuda_graph_sizes(self.cuda_graph_batch_sizes, max_batch=settings.max_batch,
                                max_num_tokens=settings.max_num_tokens)

    def kv_budget_bytes(self, capacity_bytes: float, weights: float, activations: float
                        ) -> float:
        """Bytes the KV cache gets on one device (negative: the model does not fit)."""
        reserve = self.runtime_reserve_gib * GIB
        if self.memory_of_device:
            return self.kv_fraction * capacity_bytes - weights - activations - reserve
        free = capacity_bytes - weights - activations - reserve
        return self.kv_fraction * free if free > 0 else free


def cuda_graph_sizes(sizes: tuple[int, ...], *, max_batch: int, max_num_tokens: int,
                     tokens_per_request: int = 1) -> tuple[int, ...]:
    """The CUDA-graph batch sizes an engine keeps of ``sizes``: TensorRT-LLM's PyTorch
    backend keeps the configured sizes up to the largest pure decoding batch,
    ``min(max_batch_size, max_num_tokens / (1 + draft tokens))``, and, with padding on,
    adds that bound itself when a configured size exceeds it
    (``model_engine.py::_filter_cuda_graph_batch_sizes``)."""
    cap = min(max_batch, max_num_tokens // max(1, tokens_per_request))
    kept: list[int] = []
    for i, size in enumerate(sorted(sizes)):
        if size <= cap:
            kept.append(size)
            continue
        if i == 0 or kept[-1] != cap:
            kept.append(cap)
        break
    return tuple(kept)


def cuda_graph_batch(batch: int, kept: tuple[int, ...]) -> int:
    """The batch a generation-only iteration of ``batch`` sequences runs at: the smallest
    kept CUDA-graph size that holds it (``cuda_graph_runner.py::_round_up_batch_size``,
    bisect; the missing rows are one dummy generation request repeated), or ``batch``
    itself where no graph holds it (the iteration runs eagerly) or nothing is padded
    (``kept`` empty)."""
    i = bisect.bisect_left(kept, batch)
    return kept[i] if batch >= 1 and i < len(kept) else batch


def bench_group_size(tp: int, ep: int, expert_tp: int) -> int:
    """The ``--tp`` trtllm-bench is given for a layout: ``tp``, or the whole expert group
    (``ep × expert_tp`` ranks) when the experts span data-parallel replicas — attention DP
    (``enable_attention_dp``), where TensorRT-LLM's ``tp_size`` is the attention-DP group
    and ``max_batch_size`` / ``max_num_tokens`` hold per rank ("Max batch size in each
    rank", the DeepSeek-R1 best-practice guide's ``--tp 8 --ep 8 --max_batch_size 384
    --concurrency 3072``). ``trtllm_bench_settings`` then sizes the heuristic over that
    many GPUs, and each replica runs with what it returns."""
    return max(tp, ep * expert_tp)


def trtllm_bench_settings(*, total_params: int, weight_bytes_per_param: float,
                          kv_bytes_per_token_model: float, device_gib: float, gpus: int,
                          pp: int, input_len: int, output_len: int, kv_fraction: float,
                          extra_bytes_per_request_model: float = 0.0, hybrid: bool = False,
                          chunked_prefill: bool = True) -> EngineSettings:
    """``trtllm-bench``'s ``calc_engine_setting`` + ``finetune_setting`` (see the module
    docstring): all in GiB as it computes them.

    :param kv_bytes_per_token_model: the whole model's KV bytes per token, as trtllm-bench
        counts them (2 × layers × max(tp, kv heads) × head size × KV bytes for GQA).
    :param extra_bytes_per_request_model: the whole model's cache bytes per request that do
        not grow with it (trtllm-bench's ``extra_model_cache_in_gb``: Mamba states).
    :param hybrid: a model with recurrent state (trtllm-bench's ``NemotronHybridConfig``):
        the cache fraction is squared and the batch is not rounded up.
    :param chunked_prefill: False (trtllm-bench's default) raises the token budget to at
        least the longest prompt plus the max batch (``bench/benchmark/utils/general.py``,
        ``get_settings``: "Forcing max_num_tokens to max_isl + max_batch_size"); the
        synthetic datasets have one prompt length, so max_isl = ``input_len``.
    """
    engine_gib = total_params * weight_bytes_per_param / GIB
    available = device_gib * gpus - engine_gib
    cache = available * (kv_fraction ** 2 if hybrid else kv_fraction)
    per_request = (kv_bytes_per_token_model * (input_len + output_len)
                   + extra_bytes_per_request_model) / GIB
    kv_requests = cache / per_request if per_request > 0 else 0.0
    raw_bs = min(kv_requests, 4096) / pp
    raw_tokens = min(raw_bs * (1 + input_len / output_len), 32768)
    if hybrid:
        max_bs = 2 * math.floor(raw_bs / 2)
    elif raw_bs < 256:
        max_bs = max(64, 32 * math.ceil(raw_bs / 32))
    elif raw_bs < 1024:
        max_bs = 128 * math.ceil(raw_bs / 128)
    else:
        max_bs = 256 * math.ceil(raw_bs / 256)
    if raw_tokens < 4096:
        max_tokens = max(2048, 256 * math.ceil(raw_tokens / 256))
    elif raw_tokens < 8192:
        max_tokens = 512 * math.ceil(raw_tokens / 512)
    else:
        max_tokens = 1024 * math.ceil(raw_tokens / 1024)
    if not chunked_prefill:
        max_tokens = max(max_tokens, input_len + int(max_bs))
    return EngineSettings(max_batch=int(max_bs), max_num_tokens=int(max_tokens))


ENGINES: dict[str, EngineProfile] = {
    "trtllm": EngineProfile(
        name="trtllm", kv_fraction=0.90, runtime_reserve_gib=1.5, kv_block_tokens=32,
        chunked_prefill=False, host_floor=True,
        # perf-overview's llm_options.yml (TensorRT-LLM@00f3768, docs/source/performance/
        # perf-overview.md): cuda_graph_config.enable_padding true, these batch sizes
        cuda_graph_batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 1024, 2048,
                                4096, 8192),
        # no derate: the hardware packs' GEMM efficiencies (matmul_sustained, the B200's
        # NVFP4 rate) are fitted across serving and training records alike
        # (docs/cost-model.md; they replace the former fp8 0.90 / fp4 0.58)
        description="TensorRT-LLM as trtllm-bench runs it (kv_cache_free_gpu_mem_fraction "
                    "0.90, tokens_per_block 32, GUARANTEED_NO_EVICT; CUDA graphs padded "
                    "to 1 … 8192 sequences)"),
    # vLLM V1 (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults): on a GPU of 70
    # GiB or more that is not an A100, max_num_seqs 1024 and max_num_batched_tokens 16384
    # for the offline LLM class, 8192 for the API server; elsewhere 256 sequences and
    # 8192 / 2048 tokens ("Setting large max_num_batched_tokens for A100 reduces
    # throughput", PR #17885)
    "vllm": EngineProfile(
        name="vllm", kv_fraction=0.90, runtime_reserve_gib=1.5, kv_block_tokens=16,
        memory_of_device=True,
        batch_defaults={(True, False): (1024, 16384), (True, True): (1024, 8192),
                        (False, False): (256, 8192), (False, True): (256, 2048)},
        batch_defaults_gib=70.0,
        description="vLLM V1 defaults (gpu_memory_utilization 0.9, block size 16; max_num_"
                    "seqs / max_num_batched_tokens 1024 / 16384 offline and 1024 / 8192 "
                    "served on 70 GiB and more but A100, else 256 / 8192 and 256 / 2048)"),
    # SGLang's server defaults (python/sglang/srt/server_args.py): weights and KV cache in
    # mem_fraction_static of the device (0.88 where it is not derived from the reserve),
    # chunked prefill of 8,192 tokens below 160 GB of GPU memory ("H100, H200, A100,
    # H20") and 16,384 from it ("B200, MI300"), page size 1; the request pool holds at
    # most 4,096 requests (ModelRunner's req_to_token pool), so the KV cache binds first
    "sglang": EngineProfile(
        name="sglang", kv_fraction=0.88, runtime_reserve_gib=1.5, kv_block_tokens=1,
        memory_of_device=True,
        batch_defaults={(True, False): (4096, 16384), (True, True): (4096, 16384),
                        (False, False): (4096, 8192), (False, True): (4096, 8192)},
        batch_defaults_gib=160.0,
        description="SGLang server defaults (mem_fraction_static 0.88, chunked_prefill_size "
                    "8192 below 160 GB of GPU memory and 16384 from it, page size 1)"),
}


def engine_profile(name: str | EngineProfile) -> EngineProfile:
    if isinstance(name, EngineProfile):
        return name
    try:
        return ENGINES[name.lower()]
    except KeyError:
        raise UnknownNameError(f"unknown serving engine {name!r}",
                               f"use one of {', '.join(ENGINES)}") from None
