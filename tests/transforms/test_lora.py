"""LoRA fine-tuning (zrt_core.transforms.lora): frozen base weights lose their weight
gradients, each fused linear layer gets a rank-r adapter, only adapters train."""

from __future__ import annotations

import pytest
from attrs import evolve

from zrt_core.estimate.training import capture_for_training, case_from_record, estimate_training
from zrt_core.ir.graph import Category, Phase
from zrt_core.plugins import get_plugin_manager
from zrt_core.strategy import Parallel, TrainSpec
from zrt_core.transforms.lora import LoRA, lora_inventory
from zrt_core.transforms.training import WEIGHT_GRAD, mark_weight_grads, param_inventory

# h=64, 2 layers, 4 heads of 16 (2 KV heads), FFN 128, vocab 128
TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 128, "max_position_embeddings": 256}
TOKENS, RANK = 32, 4


@pytest.fixture(scope="module")
def graphs():
    cap = capture_for_training(TINY, 1, TOKENS, host=get_plugin_manager(), use_cache=False)
    fwd = cap.graph(Phase.TRAIN_FORWARD)
    bwd = mark_weight_grads(fwd, cap.graph(Phase.TRAIN_BACKWARD))
    return cap, fwd, bwd


def _lora(nodes):
    return [n for n in nodes if n.attrs.get("lora") and n.category == Category.MATMUL]


def test_frozen_weights_lose_their_gradients_and_adapters_join_each_linear_layer(graphs):
    _, fwd, bwd = graphs
    lf, lb = LoRA(RANK).apply_pair(fwd, bwd)
    base_dw = [n for n in lb.nodes if n.category == Category.MATMUL
               and n.attrs.get("grad") == WEIGHT_GRAD and not n.attrs.get("lora")]
    assert base_dw == []
    assert not any(n.op == "aten.embedding_dense_backward.default" for n in lb.nodes)
    # every input-gradient GEMM of the base stays
    dgrads = [n for n in bwd.nodes if n.attrs.get("grad") == "input"]
    assert all(n.id in lb.by_id() for n in dgrads)
    # one layer template: Q/K/V share an input (linear_qkv), gate/up (linear_fc1), o_proj,
    # down_proj: 4 adapters, 2 forward and 4 backward GEMMs each
    assert len(_lora(lf.nodes)) == 4 * 2 and len(_lora(lb.nodes)) == 4 * 4
    # linear_qkv: X [32, 64], N = 64 + 32 + 32 = 128: X·A = 2·32·64·4 = 16384 FLOPs,
    # H·B = 2·32·4·128 = 32768; the fused gate/up: N = 256, H·B = 2·32·4·256 = 65536
    flops = sorted(n.flops for n in _lora(lf.nodes))
    assert flops == sorted([16384, 32768,            # qkv
                            16384, 16384,            # o_proj: K = N = 64
                            16384, 65536,            # gate/up
                            2 * 32 * 128 * 4, 16384])  # down_proj: K = 128, N = 64
    # the backward does twice the forward's adapter FLOPs (dgrad and wgrad)
    assert sum(n.flops for n in _lora(lb.nodes)) == 2 * sum(flops)


def test_the_frozen_layers_casts_write_no_column_wise_copy(graphs):
    # under fp8 on Hopper every cast writes row- and column-wise e4m3 copies (1 B each per
    # value); with the base weights frozen no weight-gradient GEMM reads the column-wise
    # ones, so each cast writes half: forward x (32 × 64 = 2048 values) 4096 -> 2048 B
    from zrt_core.hardware import HardwareSpec
    from zrt_core.transforms.base import TransformContext
    from zrt_core.transforms.training import Precision, precision_plan

    _, fwd, bwd = graphs
    host = get_plugin_manager(autoload=False)
    hw = HardwareSpec.from_mapping({  # fp8 units, no fp4: a Hopper-like part
        "id": "toy_gpu", "name": "toy", "vendor": "nvidia",
        "compute": {"fp32": 10, "bf16": 100, "fp16": 100, "fp8": 200},
        "memory": {"capacity_gb": 16, "bandwidth_gb_per_s": 1000},
        "interconnect": [{"name": "link", "bandwidth_gb_per_s": 100, "latency_us": 2,
                          "devices": None}]})
    plan = precision_plan("fp8", hw)
    ctx = TransformContext(dims=None, hardware=hw, parallel=Parallel(), host=host,
                           train=TrainSpec(micro_batch=1, global_batch=1, seq_len=TOKENS))
    f8 = Precision(plan).apply(fwd, ctx)
    b8 = Precision(plan, forward=fwd).apply(bwd, ctx)
    lf, lb = LoRA(RANK).apply_pair(f8, b8)
    for before, after in ((f8, lf), (b8, lb)):
        full = {n.id: n.bytes_written for n in before.nodes if n.op == "precision.quantize"}
        half = {n.id: n.bytes_written for n in after.nodes if n.op == "precision.quantize"}
        assert full and half == {i: w // 2 for i, w in full.items()}
    first = next(n for n in lf.nodes if n.op == "precision.quantize")
    assert (first.inputs[0].numel, first.bytes_written) == (TOKENS * 64, TOKENS * 64)


def test_adapters_only_on_the_named_linear_layers(graphs):
    # Megatron-Bridge's LoRA perf configs: peft.target_modules = ["linear_qkv"]. Only the
    # Q/K/V group gets an adapter: X·A = 16384 and H·B = 32768 FLOPs (above); the other
    # layers stay frozen without adapters, their input gradients kept
    _, fwd, bwd = graphs
    lf, lb = LoRA(RANK, ("linear_qkv",)).apply_pair(fwd, bwd)
    assert sorted(n.flops for n in _lora(lf.nodes)) == [16384, 32768]
    assert len(_lora(lb.nodes)) == 4
    # linear_fc1 and linear_fc2: gate/up (K 64, N 256) and down (K 128, N 64)
    lf2, _ = LoRA(RANK, ("linear_fc1", "linear_fc2")).apply_pair(fwd, bwd)
    assert sorted(n.flops for n in _lora(lf2.nodes)) == sorted([16384, 65536,
                                                                2 * 32 * 128 * 4, 16384])


def test_only_the_adapters_reduce_gradients_and_keep_optimizer_states(graphs):
    _, fwd, bwd = graphs
    lf, _ = LoRA(RANK).apply_pair(fwd, bwd)
    p = Parallel(tp=1, pp=1, dp=1)
    inv = lora_inventory(lf, p, None)
    # per layer r·(K + N): qkv 4·(64+128) + o 4·(64+64) + fc1 4·(64+256) + fc2 4·(128+64)
    #   = 768 + 512 + 1280 + 768 = 3328
    assert [g.dense for g in inv.layers.values()] == [3328]
    assert inv.embedding.total == inv.head.total == 0
    # the frozen inventory still holds the base weights
    full = param_inventory(lf, p, None)
    assert full.layers[0].dense > 3328


@pytest.mark.needs("zrt-nvidia")  # prices on the H100 pack
def test_a_lora_step_keeps_the_frozen_weights_and_stores_adapter_states_only(graphs):
    cap, _, _ = graphs
    host = get_plugin_manager()
    p = Parallel(tp=1, pp=1, dp=2)
    full = TrainSpec(micro_batch=1, global_batch=4, seq_len=TOKENS, zero=1)
    lora = evolve(full, lora_rank=RANK)
    a = estimate_training(TINY, "nvidia_h100_sxm", p, full, host=host, captured=cap)
    b = estimate_training(TINY, "nvidia_h100_sxm", p, lora, host=host, captured=cap)
    # the frozen weights stay, the adapters' bf16 weights join them: 2 layers × 3328 × 2 B
    assert b.memory.weights_bytes == a.memory.weights_bytes + 2 * 3328 * 2
    # 2 layers × 3328 adapter elements, fp32 gradients, AdamW's 12 bytes sharded over dp=2
    assert b.memory.gradients_bytes == 2 * 3328 * 4
    assert b.memory.optimizer_bytes == 2 * 3328 * 12 / 2
    assert any(n.startswith("LoRA:") for n in b.notes)


def test_records_read_lora_from_peft_or_the_id():
    base = {"id": "x-lora-y", "workload": "train", "hardware": "nvidia_h100_sxm",
            "num_gpus": 1, "seq_len": 32, "global_batch": 1, "model": {"hf_config": TINY},
            "parallel": {"tp": 1, "pp": 1, "dp": 1}}
    assert case_from_record(base).train.lora_rank == 32
    assert any("LoRA" in a for a in case_from_record(base).assumptions)
    assert case_from_record({**base, "peft": {"method": "lora", "rank": 16}}).train.lora_rank == 16
    assert case_from_record({**base, "id": "x-sft-y"}).train.lora_rank == 0
    assert case_from_record({**base, "peft": "none"}).train.lora_rank == 0
    # the adapters' layers: the record's peft.target_modules, else Megatron-Bridge's perf
    # configs' linear_qkv for its rows, else all four (None)
    assert case_from_record(base).train.lora_modules is None
    bridge = {**base, "source": "NVIDIA Megatron-Bridge performance summary, NeMo 26.06"}
    assert case_from_record(bridge).train.lora_modules == ("linear_qkv",)
    given = {**bridge, "peft": {"method": "lora", "target_modules": ["linear_fc1"]}}
    assert case_from_record(given).train.lora_modules == ("linear_fc1",)
    # NVIDIA's MLPerf Llama 2 70B LoRA: rank 16 on linear_qkv and linear_proj
    mlperf = case_from_record({**base, "source": "MLPerf Training v5.0 closed, Llama 2 70B "
                                                 "LoRA, NVIDIA"}).train
    assert (mlperf.lora_rank, mlperf.lora_modules) == (16, ("linear_qkv", "linear_proj"))
    # its frozen weights are stored quantized under fp8 (te.fp8_model_init) and nvfp4
    # (PRE_QUANTIZED_MODEL); a bf16 run keeps 16-bit weights
    assert not mlperf.quantized_params
    for precision in ("fp8", "nvfp4"):
        quantized = case_from_record({**base, "precision": precision, "source":
                                      "MLPerf Training v5.1 closed, Llama 2 70B LoRA, NVIDIA"})
        assert quantized.train.quantized_params
        assert any("stored quantized" in a for a in quantized.assumptions)
        # its configs export NCCL_NVLS_ENABLE=1, unlike MLPerf's pre-training configs
        assert quantized.nvls
    pretraining = {**base, "id": "x-pretrain-y", "precision": "fp8",
                   "source": "MLPerf Training v5.1 closed, Llama 3.1 8B, NVIDIA"}
    assert not case_from_record(pretraining).nvls


@pytest.mark.needs("zrt-nvidia")  # prices on the H100 pack
def test_a_frozen_language_model_keeps_its_input_gradients_and_drops_the_rest(graphs,
                                                                              monkeypatch):
    import zrt_core.estimate.training.estimator as training

    cap, _, _ = graphs
    host = get_plugin_manager()
    seen = []
    stages = training._stages

    def spy(f, b, *args, **kwargs):
        seen.append(b)
        return stages(f, b, *args, **kwargs)

    monkeypatch.setattr(training, "_stages", spy)
    p = Parallel(tp=1, pp=1, dp=2)
    full = TrainSpec(micro_batch=1, global_batch=4, seq_len=TOKENS, zero=1)
    frozen = evolve(full, freeze_language_model=True)
    a = estimate_training(TINY, "nvidia_h100_sxm", p, full, host=host, captured=cap)
    b = estimate_training(TINY, "nvidia_h100_sxm", p, frozen, host=host, captured=cap)
    full_bwd, frozen_bwd = seen

    def gemm_flops(g, grad):
        return sum(n.flops * g.multiplicity(n) for n in g.nodes
                   if n.category == Category.MATMUL and n.attrs.get("grad") == grad)

    # every input-gradient GEMM stays, no weight-gradient GEMM is left
    assert gemm_flops(frozen_bwd, "input") == gemm_flops(full_bwd, "input") > 0
    assert gemm_flops(full_bwd, WEIGHT_GRAD) > 0 == gemm_flops(frozen_bwd, WEIGHT_GRAD)
    assert not any(n.op == "aten.embedding_dense_backward.default" for n in frozen_bwd.nodes)
    # the weights stay, nothing else: no gradients, no optimizer states
    assert b.memory.weights_bytes == a.memory.weights_bytes
    assert b.memory.gradients_bytes == 0 and b.memory.optimizer_bytes == 0
    assert b.step_time_s < a.step_time_s
    assert any(n.startswith("language model frozen") for n in b.notes)


def test_records_freeze_the_language_model_of_megatron_bridge_qwen3_vl_runs():
    base = {"id": "mbridge-x-qwen3-vl", "workload": "train", "hardware": "nvidia_h100_sxm",
            "num_gpus": 1, "seq_len": 32, "global_batch": 1,
            "source": "NVIDIA Megatron-Bridge performance summary",
            "model": {"hf_config": {**TINY, "model_type": "qwen3_vl"}},
            "parallel": {"tp": 1, "pp": 1, "dp": 1}}
    case = case_from_record(base)
    assert case.train.freeze_language_model
    assert any("freeze_language_model=True" in a for a in case.assumptions)
    # an explicit field wins; other families and other sources train every weight
    assert not case_from_record({**base, "freeze_language_model": False}
                                ).train.freeze_language_model
    assert not case_from_record({**base, "model": {"hf_config": TINY}}
                                ).train.freeze_language_model
    assert not case_from_record({**base, "source": "a paper"}).train.freeze_language_model
