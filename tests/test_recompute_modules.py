"""Megatron-Core's selective recompute modules on a tiny MLA + MoE model: each module re-runs
exactly the forward ops Megatron re-runs (FLOPs with the arithmetic beside them), frees the
activations it discards, and bad module names are one line with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from attrs import evolve

from zrt_core.cli.main import main
from zrt_core.errors import SpecError
from zrt_core.estimate.training import capture_for_training, estimate_training
from zrt_core.plugins import PluginHost, get_plugin_manager
from zrt_core.strategy import Parallel, TrainSpec
from zrt_core.transforms.training import Recompute

# DeepSeek-V3 in miniature: h=64, 4 heads, MLA (q latent 32, kv latent 16, qk 8+8 rope,
# v 8); layer 0 dense (FFN 64), layer 1 MoE (4 experts of FFN 32, top-2, 1 shared expert)
MLA_MOE = {"model_type": "deepseek_v3", "hidden_size": 64, "intermediate_size": 64,
           "moe_intermediate_size": 32, "num_hidden_layers": 2, "first_k_dense_replace": 1,
           "num_attention_heads": 4, "num_key_value_heads": 4, "n_routed_experts": 4,
           "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
           "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
           "qk_rope_head_dim": 8, "v_head_dim": 8, "vocab_size": 128,
           "max_position_embeddings": 256}
S = 16  # tokens of the one micro-batch (micro-batch 1, global batch 1, one device)

# the fused kernels' counts (zrt's formulas): RMSNorm 4 FLOPs per element + 2 per row
NORM_H = 4 * S * 64 + 2 * S  # 4128, an [S, 64] norm
# -- per-module extra FLOPs (one micro-batch) ---------------------------------------------
# core_attn: the attention core forward; causal: 16·17/2 = 136 (q, k) pairs, 2 FLOPs each
# for QKᵀ over 16 qk dims and for PV over 8 v dims, 4 heads: 2·136·4·(16 + 8) = 26112; 2 layers
CORE_ATTN = 2 * (2 * 136 * 4 * (16 + 8))
# mla_up_proj (qkv_up_proj_and_rope_apply): q up-proj 2·16·32·(4·16) = 65536, kv up-proj
# 2·16·16·(4·(8 + 8)) = 32768, the q/kv latent norms TE fuses into them 4·16·32 + 32 = 2080
# and 4·16·16 + 32 = 1056, RoPE 3 FLOPs per rotated element on q_pe 16·4·8 and k_pe 16·8
# (3·640 = 1920); 2 layers
MLA_UP_PROJ = 2 * (65536 + 32768 + 2080 + 1056 + 3 * (S * 4 * 8 + S * 8))
# layernorm: the MoE layer's pre-MLP norm (a separate module there; dense layers and the
# attention fuse their norms into TE's LayerNorm-linear)
LAYERNORM = NORM_H
# moe_act: SwiGLU between the grouped FC1 and FC2: 16 tokens · top-2 = 32 rows of 32, 2 FLOPs
MOE_ACT = 2 * (2 * S) * 32
# mlp: layer 0's norm (fused into FC1) + gate, up 2·16·64·64 each + SwiGLU 2·16·64 + down
MLP = NORM_H + 3 * (2 * S * 64 * 64) + 2 * S * 64
# shared_experts: gate, up, down 2·16·64·32 each + SwiGLU 2·16·32
SHARED = 3 * (2 * S * 64 * 32) + 2 * S * 32
# moe: the whole MoE layer: router GEMM 2·16·64·4, its top-k / softmax kernels (560, their
# own counts: 240 + 16 + 128 + 64 + 32 + 80), grouped FC1 2·32·64·64 and FC2 2·32·32·64, the
# SwiGLU, the combine (2 FLOPs per routed element: 2·32·64), the shared expert and the
# shared + routed add (16·64)
MOE = (2 * S * 64 * 4 + 560 + 2 * 32 * 64 * 64 + 2 * 32 * 32 * 64 + MOE_ACT + 2 * 32 * 64
       + SHARED + S * 64)

EXTRA_FLOPS = {"core_attn": CORE_ATTN, "mla_up_proj": MLA_UP_PROJ, "layernorm": LAYERNORM,
               "moe_act": MOE_ACT, "mlp": MLP, "shared_experts": SHARED, "moe": MOE}

# -- activation bytes each frees (bf16 = 2 bytes; one micro-batch) --------------------------
FREED = {
    # fused attention keeps no softmax; its output stays saved (the projection reads it
    # before the re-run); its softmax statistics (fp32 [4 heads, 16], 256 B) are made again:
    # 2 layers
    "core_attn": 2 * 4 * S * 4,
    # per layer: q/kv latent-norm outputs 16·32 + 16·16, the kv up-proj output 16·64, k and q
    # 4·16·16 each, freed; the latents 16·32 + 16·24 (the checkpoint's inputs) were kept
    # already, as the inputs of the fused latent norms; the two latent norms' fp32 rstd
    # [16, 1] are made again too
    "mla_up_proj": 2 * (2 * (S * 32 + S * 16 + S * 64 + 2 * 4 * S * 16) + 2 * 4 * S),
    # the norm output 16·64 and its fp32 rstd [16, 1] freed; its input (the residual
    # stream), the checkpoint's input, was kept already as the fused norm's input
    "layernorm": 2 * S * 64 + 4 * S,
    # the SwiGLU output 32·32
    "moe_act": 2 * 32 * 32,
    # the norm and SwiGLU outputs 16·64 each, the gate and up GEMM outputs 16·64 each (the
    # SwiGLU's inputs, made again with it) and the norm's fp32 rstd [16, 1] freed; the
    # layer's residual (the checkpoint's input) was kept already as the fused norm's input
    "mlp": 2 * 2 * S * 64 + 2 * 2 * S * 64 + 4 * S,
    # the shared expert's SwiGLU output 16·32 and its gate and up outputs 16·32 each
    "shared_experts": 2 * S * 32 + 2 * 2 * S * 32,
    # router fp32 input 16·64·4 B, top-k indices 32·8 B, two fp32 [16, 2] probs, dispatched
    # tokens 32·64·2 B, the permutation map 32·8 B, SwiGLU 32·32·2 B, shared SwiGLU
    # 16·32·2 B; the router's fp32 bias buffer (4·4 B) now kept. The FC2 output is not saved
    # with or without recompute (the combine weighs nothing: the probabilities enter the
    # activation, Megatron-Core >= 0.13; docs/training-model.md)
    # and the inputs the top-k weights' fused normalisation keeps without recompute (the
    # gathered fp32 probabilities [16, 2] and their sum [16, 1]: 16·3·4 B); and what the
    # re-run makes again that fused kernels kept as their inputs: the grouped FC1 output
    # 32·64·2 B (the SwiGLU's), the shared expert's gate and up outputs 2·16·32·2 B, the
    # router's fp32 sigmoid scores 16·4·4 B
    "moe": (S * 64 * 4 + 32 * 8 + 2 * 32 * 4 + 32 * 64 * 2 + 32 * 8 + 32 * 32 * 2
            + S * 32 * 2 - 4 * 4 + S * 3 * 4 + 32 * 64 * 2 + 2 * S * 32 * 2 + S * 4 * 4),
}


@pytest.fixture(scope="module")
def host() -> PluginHost:
    return get_plugin_manager()


@pytest.fixture(scope="module")
def tiny(host: PluginHost):
    return capture_for_training(MLA_MOE, 1, S, host=host, use_cache=False)


@pytest.fixture(scope="module")
def none(tiny, host):
    return estimate_training(MLA_MOE, "nvidia_h100_sxm", Parallel(), _train(), host=host,
                             captured=tiny)


def _train(**changes) -> TrainSpec:
    return evolve(TrainSpec(micro_batch=1, global_batch=1, seq_len=S), **changes)


def _selective(tiny, host, modules, parallel=None):
    p = parallel or Parallel()
    return estimate_training(MLA_MOE, "nvidia_h100_sxm", p,
                             _train(recompute="selective", recompute_modules=modules,
                                    global_batch=p.dp), host=host, captured=tiny)


@pytest.mark.needs("zrt-nvidia")
@pytest.mark.parametrize("module", sorted(EXTRA_FLOPS))
def test_each_module_reruns_exactly_its_ops_and_frees_its_activations(
        tiny, host, none, module: str) -> None:
    got = _selective(tiny, host, (module,))
    assert got.hardware_flops - none.hardware_flops == EXTRA_FLOPS[module]
    assert got.model_flops == none.model_flops
    assert got.recompute_s > 0 and none.recompute_s == 0
    assert none.memory.activation_bytes_per_microbatch - \
        got.memory.activation_bytes_per_microbatch == FREED[module]


@pytest.mark.needs("zrt-nvidia")
def test_modules_that_rerun_disjoint_ops_add_up(tiny, host) -> None:
    parts = ("mla_up_proj", "layernorm", "moe_act", "mlp", "shared_experts")
    alone = [_selective(tiny, host, (m,)) for m in parts]
    together = _selective(tiny, host, parts)
    assert together.recompute_s == pytest.approx(sum(r.recompute_s for r in alone), rel=1e-9)
    # an empty list (Megatron-Bridge's `selective, []`) re-runs nothing
    assert _selective(tiny, host, ()).recompute_s == 0
    # no list: Megatron-Core's default, core_attn
    default = estimate_training(MLA_MOE, "nvidia_h100_sxm", Parallel(),
                                _train(recompute="selective"), host=host, captured=tiny)
    assert default.recompute_s == _selective(tiny, host, ("core_attn",)).recompute_s


@pytest.mark.needs("zrt-nvidia")
def test_moe_recompute_reruns_the_dispatch_and_combine_all_to_all(
        tiny, host, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    apply = Recompute.apply

    def spy(self, graph, ctx):
        out = apply(self, graph, ctx)
        seen.append(out)
        return out

    monkeypatch.setattr(Recompute, "apply", spy)
    ep = Parallel(ep=2, dp=2)
    _selective(tiny, host, ("moe",), ep)
    rerun = [n for n in seen[-1].nodes if n.attrs.get("recompute")]
    # one MoE layer: its dispatch and its combine all-to-all run again, as in the forward
    assert sorted(n.attrs.get("moe") for n in rerun if n.op == "comm.all_to_all") == \
        ["combine", "dispatch"]
    _selective(tiny, host, ("moe_act",), ep)
    assert not [n for n in seen[-1].nodes if n.attrs.get("recompute")
                and n.category == "collective"]


def test_bad_module_names_and_modes_are_spec_errors() -> None:
    with pytest.raises(SpecError, match="unknown recompute module 'attn'"):
        _train(recompute="selective", recompute_modules=("attn",))
    with pytest.raises(SpecError, match="need recompute=selective"):
        _train(recompute="full", recompute_modules=("moe",))
    assert _train(recompute="selective", recompute_modules="moe_act, layernorm") \
        .recompute_modules == ("moe_act", "layernorm")


@pytest.mark.needs("zrt-nvidia")
def test_mla_up_proj_on_a_model_without_mla_is_refused(host) -> None:
    gpt2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_inner": 256,
            "vocab_size": 128, "n_positions": 256}
    with pytest.raises(SpecError, match="mla_up_proj needs multi-latent attention"):
        estimate_training(gpt2, "nvidia_h100_sxm", Parallel(),
                          _train(recompute="selective", recompute_modules=("mla_up_proj",)),
                          host=host)


@pytest.mark.needs("zrt-nvidia")
def test_cli_bad_module_is_one_line_exit_2(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("ZRT_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "config.json").write_text(json.dumps(MLA_MOE))
    code = main(["run", str(tmp_path), "--hw", "h100", "--train", "--seq-len", "16",
                 "--recompute", "selective", "--recompute-modules", "moe_act,bogus"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("zrt: error: unknown recompute module 'bogus'")
    assert err.count("\n") == 1


def test_the_estimate_spec_takes_recompute_modules(tmp_path: Path) -> None:
    import yaml

    from zrt_core.analytic.spec import EstimateSpec

    spec = {"model": "llama3-8b", "hardware": "h100",
            "parallel": {"tp": 1, "pp": 1, "dp": 1},
            "train": {"micro_batch": 1, "seq_len": 4096, "recompute": "selective",
                      "recompute_modules": ["moe_act", "layernorm"]}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert EstimateSpec.from_yaml(path).train.recompute_modules == ("moe_act", "layernorm")
    spec["train"]["recompute_modules"] = ["moe_ac"]
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(SpecError, match="unknown recompute module 'moe_ac'"):
        EstimateSpec.from_yaml(path)


def _public_record(rid: str) -> dict:
    import yaml

    from zrt_core import recipes

    path = Path(recipes.__file__).parent / "data" / "validation" / "public.yaml"
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return next(r for r in yaml.load(path.read_text(encoding="utf-8"), Loader=loader)
                if r["id"] == rid)


@pytest.mark.parametrize(("rid", "modules"), [
    # gpt_oss/h100: GPT_OSS_120B_H100_BF16_BASE_CONFIG, recompute_modules=[layernorm, moe_act]
    ("mbridge-26.04-pre-training-gpt-oss-120b-h100-64gpu-bf16-gbs1280",
     ("layernorm", "moe_act")),
    # deepseek/gb200 MXFP8 (26.08): ["mla_up_proj"]; gb300 MXFP8: [] (selective, nothing)
    ("mbridge-26.08-pre-training-deepseek-v3-gb200-256gpu-mxfp8-gbs4096", ("mla_up_proj",)),
    ("mbridge-26.08-pre-training-deepseek-v3-gb300-256gpu-mxfp8-gbs4096", ()),
])
def test_megatron_bridge_records_take_their_recipes_recompute(rid: str, modules) -> None:
    from zrt_core.estimate.training import case_from_record

    case = case_from_record(_public_record(rid))
    assert (case.train.recompute, case.train.recompute_modules) == ("selective", modules)
    assert any(a.startswith(f"recompute=selective [{', '.join(modules)}] (Megatron-Bridge")
               for a in case.assumptions)


def test_a_granularity_left_to_the_provider_is_no_recompute() -> None:
    from zrt_core import recipes
    from zrt_core.estimate.training.records import record_recompute

    # 25.11's GPT-OSS B200 config writes recompute_modules but leaves the granularity to the
    # provider (unresolved in the table): Megatron-Core's None, no recompute
    row = next(r for r in recipes.load_rows() if (r.release, r.model, r.gpu, r.precision)
               == ("25.11", "gpt_oss_120b", "b200", "bf16"))
    assert row.recompute_modules == ("layernorm", "moe_act")
    notes: list[str] = []
    assert record_recompute(row, notes) == ("none", None)
    assert "provider default not resolved" in notes[0]
    notes = []
    assert record_recompute(None, notes) == ("none", None) and notes == ["recompute=none"]


# GPT-OSS in miniature: its clamped SwiGLU with a per-row expert bias is one fused kernel
GPT_OSS = {"model_type": "gpt_oss", "hidden_size": 128, "intermediate_size": 64,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 32, "num_local_experts": 4, "num_experts_per_tok": 2,
           "sliding_window": 8, "vocab_size": 512}


@pytest.mark.needs("zrt-nvidia")
def test_a_fused_activation_keeps_its_input_so_moe_act_frees_only_its_output(host) -> None:
    # Without recompute the fused SwiGLU's backward recomputes its internals from its input,
    # the fc1 output (32 rows × 128), which is kept (Megatron's bias_swiglu saves its input);
    # the per-row bias gathered from the expert-bias parameter is no activation. With
    # moe_act the output (32 rows × 64, bf16) is freed and nothing is added: 2 layers ·
    # 32 · 64 · 2 B = 8192 B less
    none, act = _without_and_with_moe_act(GPT_OSS, host)
    assert none.memory.activation_bytes_per_microbatch - \
        act.memory.activation_bytes_per_microbatch == 2 * 32 * 64 * 2


def _without_and_with_moe_act(config, host):
    """One micro-batch of ``config`` on one H100 without recompute, then with ``moe_act``."""
    captured = capture_for_training(config, 1, S, host=host, use_cache=False)
    return tuple(estimate_training(config, "nvidia_h100_sxm", Parallel(),
                                   _train(recompute="selective" if m else "none",
                                          recompute_modules=m),
                                   host=host, captured=captured)
                 for m in (None, ("moe_act",)))


# Nemotron 3 Super's latent MoE in miniature: the routed experts work in a 16-wide latent
# space between fc1_latent_proj and fc2_latent_proj (a GEMM after the combine); layer 0 is
# Mamba, layer 1 the MoE (4 experts of FFN 32, top-2, relu² activation)
LATENT_MOE = {"model_type": "nemotron_h", "hybrid_override_pattern": "ME",
              "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 32,
              "mlp_hidden_act": "relu2", "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "mamba_num_heads": 4, "mamba_head_dim": 16,
              "ssm_state_size": 8, "n_groups": 1, "conv_kernel": 4, "expand": 1,
              "chunk_size": 8, "n_routed_experts": 4, "n_shared_experts": 1,
              "num_experts_per_tok": 2, "moe_intermediate_size": 32, "moe_latent_size": 16,
              "moe_shared_expert_intermediate_size": 32, "n_group": 1, "topk_group": 1,
              "norm_topk_prob": True, "routed_scaling_factor": 1.0, "vocab_size": 128,
              "max_position_embeddings": 256, "tie_word_embeddings": False}


@pytest.mark.needs("zrt-nvidia")
def test_moe_act_on_a_latent_moe_reruns_the_activation_only(host) -> None:
    # moe_act re-runs what TEGroupedMLP wraps in CheckpointWithoutOutput: relu² on the fc1
    # output, 16 tokens · top-2 = 32 rows of 32, relu and square 1 FLOP each: 2·32·32 = 2048.
    # The combine and fc2_latent_proj after it are outside (re-running the combine would add
    # its 2 FLOPs per routed element, 2·32·16 = 1024, and an all-to-all under EP). It frees
    # the activation's output, 32·32 bf16 = 2048 B; the fc1 output it re-runs from was kept
    # already (the fused activation's input).
    none, act = _without_and_with_moe_act(LATENT_MOE, host)
    assert act.hardware_flops - none.hardware_flops == 2 * 32 * 32
    assert none.memory.activation_bytes_per_microbatch - \
        act.memory.activation_bytes_per_microbatch == 32 * 32 * 2
