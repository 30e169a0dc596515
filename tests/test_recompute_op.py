"""``--recompute op``: PyTorch's selective checkpointing with torchtitan's op policy on a tiny
Llama. Each layer re-runs its forward less what the policy saves (every second ``aten.mm``
output is dropped, SDPA outputs are kept; float8 linears' ``_scaled_mm`` is never kept), so
its extra work is the full recompute's less the saved ops (FLOPs with the arithmetic beside
them), and torchtitan records and job configs select it."""

from __future__ import annotations

import pytest
from attrs import evolve

from zrt_core.cli.main import main
from zrt_core.errors import SpecError
from zrt_core.estimate.training import capture_for_training, estimate_training
from zrt_core.ir.graph import Category, Phase
from zrt_core.plugins import PluginHost, get_plugin_manager
from zrt_core.strategy import Parallel, TrainSpec
from zrt_core.transforms.training.recompute import op_policy_saved

# h=64, 4 query heads and 2 KV heads of 16, FFN 128, 2 layers
LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "vocab_size": 128, "max_position_embeddings": 256}
S = 16  # tokens of the one micro-batch
# what the policy saves in a layer, in forward FLOPs: q 2·16·64·64 = 131072, v 2·16·64·32 =
# 65536, gate and down 2·16·64·128 = 262144 each (the 1st, 3rd, 5th and 7th aten.mm), and the
# causal attention, 16·17/2 = 136 (q, k) pairs × 2 FLOPs × 4 heads × (16 + 16) = 34816
SAVED_MM = 131072 + 65536 + 2 * 262144
ATTENTION = 136 * 2 * 4 * (16 + 16)


@pytest.fixture(scope="module")
def host() -> PluginHost:
    return get_plugin_manager()


@pytest.fixture(scope="module")
def tiny(host: PluginHost):
    return capture_for_training(LLAMA, 1, S, host=host, use_cache=False)


def _estimate(tiny, host, recompute: str, precision: str = "bf16"):
    train = evolve(TrainSpec(micro_batch=1, global_batch=1, seq_len=S),
                   recompute=recompute, precision=precision)
    return estimate_training(LLAMA, "nvidia_h100_sxm", Parallel(), train, host=host,
                             captured=tiny)


def test_the_policy_saves_every_other_mm_and_the_attention(tiny) -> None:
    forward = tiny.graphs[Phase.TRAIN_FORWARD]
    layer = [n for n in forward.nodes if n.layer_index == 0]
    saved = {n.module_path.rsplit(".", 1)[-1] for n in layer if n.id in op_policy_saved(layer)}
    # q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj: the odd ones kept
    assert {"q_proj", "v_proj", "gate_proj", "down_proj"} <= saved
    assert not {"k_proj", "o_proj", "up_proj"} & saved
    assert any(n.category == Category.ATTENTION and n.id in op_policy_saved(layer)
               for n in layer)


@pytest.mark.needs("zrt-nvidia")
@pytest.mark.parametrize(("precision", "kept"), [
    ("bf16", 2 * (SAVED_MM + ATTENTION)),  # 2 layers
    # float8 linears run _scaled_mm, which the policy does not save: only attention is kept
    ("fp8", 2 * ATTENTION),
])
def test_op_reruns_the_full_recompute_less_what_the_policy_saved(
        tiny, host, precision: str, kept: int) -> None:
    none, op, full = (_estimate(tiny, host, r, precision) for r in ("none", "op", "full"))
    assert (full.hardware_flops - none.hardware_flops) - \
        (op.hardware_flops - none.hardware_flops) == kept
    assert op.model_flops == none.model_flops
    assert 0 < op.recompute_s < full.recompute_s
    # it keeps less than no recompute and more than the full one
    assert full.memory.activation_bytes_per_microbatch < \
        op.memory.activation_bytes_per_microbatch < none.memory.activation_bytes_per_microbatch


def test_torchtitan_configs_and_records_select_it() -> None:
    from zrt_core.frameworks import read_text

    job = ('[parallelism]\ndata_parallel_shard_degree = 8\n[activation_checkpoint]\n'
           'mode = "selective"\nselective_ac_option = "{}"\n')
    read = read_text("torchtitan", job.format("op"))
    assert read.values["recompute"] == "op"
    assert not any("selective_ac_option" in i for i in read.ignored)
    # every second layer fully checkpointed: still priced as zrt's selective, with a note
    assert read_text("torchtitan", job.format("2")).values["recompute"] == "selective"

    from zrt_core.estimate.training.spec import source_recompute

    said: list[str] = []
    assert source_recompute("torchtitan benchmarks/llama3_h100_202412_torchtitan.md",
                            "selective", said) == "op"
    assert said and said[0].startswith("recompute selective as op")
    assert source_recompute("torchtitan benchmarks", "full", []) == "full"
    assert source_recompute("Megatron-LM README", "selective", []) == "selective"


@pytest.mark.needs("zrt-nvidia")
@pytest.mark.parametrize("emit", ["megatron", "bridge"])
def test_megatron_emitters_refuse_it_in_one_line(emit: str, capsys) -> None:
    rc = main(["run", "llama3.1-8b", "--train", "--hw", "h100", "--fsdp", "--zero", "3",
               "--dp", "8", "--recompute", "op", "--emit", emit])
    err = capsys.readouterr().err
    assert rc == 2 and "has no such setting" in err and "Traceback" not in err


def test_spec_refuses_modules_with_it() -> None:
    with pytest.raises(SpecError, match="recompute modules need recompute=selective"):
        TrainSpec(micro_batch=1, global_batch=1, seq_len=S, recompute="op",
                  recompute_modules=("core_attn",))
