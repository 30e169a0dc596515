"""estimate_training on a captured tiny GPT-2: the step identities, memory arithmetic with the
formulas beside it, 1F1B in-flight counts, infeasible layouts reported, bad layouts refused."""

from __future__ import annotations

import pytest
from attrs import evolve

from zrt_core.errors import LayoutError, SpecError
from zrt_core.estimate.training import capture_for_training, estimate_training
from zrt_core.hardware import HardwareSpec
from zrt_core.plugins import PluginHost, get_plugin_manager
from zrt_core.reports.training import identities
from zrt_core.strategy import Parallel, TrainSpec

# h=64, 4 layers of 4 heads, FFN 256, vocab 128 (tied), 256 positions
TINY = {"model_type": "gpt2", "n_embd": 64, "n_layer": 4, "n_head": 4, "n_inner": 256,
        "vocab_size": 128, "n_positions": 256}
MB, SEQ = 2, 64
# parameters: per layer ln_1 (2·64) + c_attn (64·192 + 192) + c_proj (64·64 + 64) + ln_2 (128)
# + c_fc (64·256 + 256) + mlp c_proj (256·64 + 64) = 128 + 12480 + 4160 + 128 + 16640 + 16448
PER_LAYER = 49984
# wte 128·64 + wpe 256·64; ln_f 2·64; the LM head is tied to wte
EMBEDDING, HEAD = 8192 + 16384, 128
PARAMS = 4 * PER_LAYER + EMBEDDING + HEAD  # 224640


@pytest.fixture(scope="module")
def host() -> PluginHost:
    return get_plugin_manager()


@pytest.fixture(scope="module")
def tiny(host: PluginHost):
    return capture_for_training(TINY, MB, SEQ, host=host, use_cache=False)


def _train(**changes) -> TrainSpec:
    return evolve(TrainSpec(micro_batch=MB, global_batch=16, seq_len=SEQ), **changes)


def _estimate(tiny, host, parallel: Parallel, train: TrainSpec, hw="nvidia_h100_sxm", **kw):
    return estimate_training(TINY, hw, parallel, train, host=host, captured=tiny, **kw)


LAYOUTS = [
    (Parallel(dp=4), _train()),
    (Parallel(dp=2, pp=2), _train(recompute="full")),
    (Parallel(pp=2, vp=2, dp=2), _train(pp_schedule="interleaved", recompute="selective")),
    (Parallel(tp=2, dp=2), _train()),
    (Parallel(dp=2), _train(zero=3)),
    (Parallel(dp=2), _train(zero=2, precision="fp8")),
    (Parallel(pp=2, dp=1), _train(global_batch=8, pp_schedule="zb-h1")),
    (Parallel(pp=2, dp=1), _train(global_batch=8, pp_schedule="dualpipev")),
    (Parallel(dp=2), _train(optimizer="muon")),
]


@pytest.mark.needs("zrt-nvidia")
@pytest.mark.parametrize(("parallel", "train"), LAYOUTS,
                         ids=[f"{p.describe()}-{t.recompute}-z{t.zero}-{t.pp_schedule}-"
                              f"{t.precision}-{t.optimizer}" for p, t in LAYOUTS])
def test_step_identities_hold(tiny, host, parallel: Parallel, train: TrainSpec) -> None:
    r = _estimate(tiny, host, parallel, train)
    for name, (left, right) in identities(r).items():
        assert left == pytest.approx(right, rel=1e-9, abs=1e-15), name
    assert r.bubble_s >= -1e-12
    # every exposed group is part of the step; the pipeline part is inside the pipeline
    assert r.exposed_comm_total_s <= r.step_time_s - r.compute_s + 1e-12
    # tokens/s per GPU = global batch × sequence / (step × GPUs)
    assert r.tokens_per_s_per_gpu == pytest.approx(
        train.global_batch * SEQ / (r.step_time_s * parallel.world_size))
    data = r.to_json()
    for key in ("step_time_s", "pipeline_s", "optimizer_s", "optimizer_comm_exposed_s",
                "compute_s", "forward_s", "backward_s", "recompute_s", "bubble_s",
                "exposed_comm_s", "hidden_comm_s", "tokens_per_s_per_gpu", "mfu", "hfu"):
        assert key in data
    assert data["memory"]["peak_gib"] > 0


@pytest.mark.needs("zrt-nvidia")
def test_adam_bytes_per_parameter_follow_the_zero_stage(tiny, host) -> None:
    gib = 2.0 ** 30

    def mem(zero: int):
        r = _estimate(tiny, host, Parallel(dp=2), _train(zero=zero))
        return r.memory

    # ZeRO-1 (Megatron's distributed optimizer): bf16 weights 2 B, fp32 gradients 4 B,
    # fp32 master + m + v 12 B sharded over dp = 2: 224640 × (2 + 4 + 12/2) bytes
    m1 = mem(1)
    assert (m1.weights_bytes, m1.gradients_bytes, m1.optimizer_bytes) == (
        2 * PARAMS, 4 * PARAMS, 12 * PARAMS / 2)
    m0 = mem(0)
    assert m0.optimizer_bytes == 12 * PARAMS  # unsharded: 2 + 4 + 12 = 18 B per parameter
    m2 = mem(2)
    assert m2.gradients_bytes == 4 * PARAMS / 2
    m3 = mem(3)
    assert (m3.weights_bytes, m3.gradients_bytes, m3.optimizer_bytes) == (
        2 * PARAMS / 2, 4 * PARAMS / 2, 12 * PARAMS / 2)
    # ZeRO-3 keeps the gathered weights of the layer in use and of the one prefetched
    assert m3.comm_buffer_bytes == 2 * 2 * PER_LAYER
    assert m3.peak_bytes / gib < m1.peak_bytes / gib


@pytest.mark.needs("zrt-nvidia")
def test_fp16_keeps_fp16_gradients_as_in_the_zero_paper(tiny, host) -> None:
    # 2 + 2 + 12 = 16 bytes per parameter without sharding (Rajbhandari et al. 2020)
    r = _estimate(tiny, host, Parallel(dp=2), _train(zero=0, precision="fp16"))
    m = r.memory
    assert (m.weights_bytes + m.gradients_bytes + m.optimizer_bytes) == 16 * PARAMS


@pytest.mark.needs("zrt-nvidia")
def test_one_f_one_b_keeps_pp_micro_batches_in_flight_on_the_first_rank(tiny, host) -> None:
    r = _estimate(tiny, host, Parallel(pp=4), _train(global_batch=16))  # 8 micro-batches
    m = r.memory
    assert r.microbatches == 8
    # rank s warms up with pp - s - 1 forwards and holds one more: the first rank holds 4
    assert (m.rank, m.inflight_microbatches) == (0, 4)
    assert m.activations_bytes == pytest.approx(4 * r.stages[0].activation_bytes)
    gpipe = _estimate(tiny, host, Parallel(pp=4), _train(global_batch=16, pp_schedule="gpipe"))
    assert gpipe.memory.inflight_microbatches == 8  # GPipe keeps every micro-batch


@pytest.mark.needs("zrt-nvidia")
def test_full_recompute_trades_activations_for_forward_flops(tiny, host) -> None:
    none = _estimate(tiny, host, Parallel(dp=2), _train())
    full = _estimate(tiny, host, Parallel(dp=2), _train(recompute="full"))
    assert full.memory.activation_bytes_per_microbatch < \
        none.memory.activation_bytes_per_microbatch
    assert full.recompute_s > 0 and none.recompute_s == 0
    # the executed FLOPs grow by one forward of the layers per micro-batch and replica:
    # MFU is unchanged in FLOPs (model FLOPs), HFU counts the recompute
    layer_forward = sum(s.forward_flops for s in full.stages) - sum(
        n.flops for n in tiny.graph("train_forward").nodes if n.layer_index is None)
    assert full.hardware_flops - none.hardware_flops == pytest.approx(
        layer_forward * full.microbatches * 2, rel=1e-6)
    assert full.model_flops == none.model_flops
    assert full.hfu / full.mfu > none.hfu / none.mfu


@pytest.mark.needs("zrt-nvidia")
def test_an_infeasible_layout_is_reported_with_the_numbers(tiny, host) -> None:
    small = evolve(host.hardware_spec("nvidia_h100_sxm"),
                   memory=evolve(host.hardware_spec("nvidia_h100_sxm").memory,
                                 capacity_gb=0.0001))
    assert isinstance(small, HardwareSpec)
    r = _estimate(tiny, host, Parallel(dp=2), _train(), hw=small)
    assert not r.feasible and not r.memory.feasible
    assert any("does not fit" in n for n in r.notes)
    assert r.step_time_s > 0


@pytest.mark.parametrize(("parallel", "train", "kw", "rule"), [
    (Parallel(dp=2), _train(), {"num_gpus": 8}, "tp × cp × pp × dp"),
    (Parallel(ep=2, dp=2), _train(), {}, "no routed experts"),
    (Parallel(pp=3), _train(global_batch=6), {}, "does not divide the 4 layers"),
    (Parallel(dp=2), _train(global_batch=6), {}, "not divisible by micro-batch × dp"),
    (Parallel(pp=2, vp=2), _train(global_batch=6, pp_schedule="interleaved"), {},
     "multiple of pp"),
])
@pytest.mark.needs("zrt-nvidia")
def test_bad_layouts_raise_a_layout_error_naming_the_rule(tiny, host, parallel, train, kw,
                                                         rule) -> None:
    with pytest.raises(LayoutError, match=rule):
        _estimate(tiny, host, parallel, train, **kw)


@pytest.mark.parametrize(("schedule", "pp", "vp", "m"), [
    ("1f1b", 4, 1, 2000), ("interleaved", 4, 3, 600), ("zb-h1", 4, 1, 1200)])
def test_long_pipelines_are_simulated_exactly(schedule, pp, vp, m) -> None:
    from zrt_core.estimate.training import _pipeline
    from zrt_core.schedule.pipeline import StageTimes, simulate, virtual_stages

    n = virtual_stages(schedule, pp, vp)
    # uneven stages (the first and last carry the embedding and the head) and P2P lags
    fwd = [1.0 + 0.1 * (v % 3) + (0.5 if v == n - 1 else 0.0) for v in range(n)]
    bwd = [2.0 * f + 0.05 for f in fwd]
    times = StageTimes(fwd, bwd, weight_s=[0.4 * b for b in bwd],
                       activation_bytes=[1.0] * n)
    p2p = [0.01 * (i + 1) for i in range(pp - 1)]
    fast = _pipeline(schedule, times, pp, vp, m, p2p, 0.05)
    full = simulate(schedule, times, pp=pp, vp=vp, microbatches=m, p2p_s=p2p, p2p_wrap_s=0.05)
    assert fast.total_s == pytest.approx(full.total_s, rel=1e-9)
    for r, stats in enumerate(full.ranks):
        assert fast.busy_s[r] == pytest.approx(stats.busy_s, rel=1e-9)
        assert fast.bubble_s[r] == pytest.approx(stats.bubble_s, rel=1e-9, abs=1e-9)
        assert fast.peak_inflight[r] == stats.peak_inflight


@pytest.mark.needs("zrt-nvidia")
@pytest.mark.parametrize("parallel", [Parallel(dp=4), Parallel(dp=2, pp=2)],
                         ids=["dp4", "pp2"])
def test_host_launches_show_as_exposed_host_time(tiny, host, parallel: Parallel) -> None:
    # the tiny model's kernels take microseconds: at 1 ms per launch the host bounds the
    # step, its wait counted as exposed "host" inside the pipeline (identities still hold);
    # full CUDA graphs (or no host cost) leave the kernel-only estimate
    pack = host.hardware_spec("nvidia_h100_sxm")
    hw = evolve(pack, efficiency=evolve(pack.efficiency, host_launch_us=0.0))
    slow = evolve(pack, efficiency=evolve(pack.efficiency, host_launch_us=1000.0))
    base = _estimate(tiny, host, parallel, _train(), hw=hw)
    r = _estimate(tiny, host, parallel, _train(), hw=slow)
    assert "host" not in base.exposed_comm_s
    assert r.exposed_comm_s["host"] > 0
    assert r.step_time_s > base.step_time_s + r.exposed_comm_s["host"] / 2
    for name, (left, right) in identities(r).items():
        assert left == pytest.approx(right, rel=1e-9, abs=1e-15), name
    graphed = _estimate(tiny, host, parallel, _train(), hw=slow, cuda_graph="full")
    assert graphed.step_time_s == pytest.approx(base.step_time_s)


@pytest.mark.needs("zrt-nvidia")
def test_uneven_pipeline_splits_reach_the_stages(tiny, host) -> None:
    from zrt_core.schedule.stages import StageSplit

    train = _train(global_batch=16)  # 8 micro-batches
    # 4 layers over pp 3: Megatron refuses an even split; first 2 leaves 1 + 1
    r = _estimate(tiny, host, Parallel(pp=3), train, stage_split=StageSplit(first_layers=2))
    assert [s.layers for s in r.stages] == [(0, 2), (2, 3), (3, 4)]
    assert any("pipeline layout Ett|t|tL" in n for n in r.notes)
    for name, (left, right) in identities(r).items():
        assert left == pytest.approx(right, rel=1e-9, abs=1e-15), name
    # a layout with an empty middle stage: it only passes activations on (no compute)
    e = _estimate(tiny, host, Parallel(pp=3), train,
                  stage_split=StageSplit(layout="Ett||ttL"))
    assert [s.layers for s in e.stages] == [(0, 2), (2, 2), (2, 4)]
    assert e.stages[1].forward_s == 0 and e.stages[1].backward_s == 0
    assert e.stages[0].forward_s > 0 and e.stages[2].forward_s > 0
    # interleaved, 4 layers over pp 2 × vp 2 = 4 chunks: first 2 → one layer per chunk on
    # rank 0; rank 1 takes the other 2, one per chunk
    i = _estimate(tiny, host, Parallel(pp=2, vp=2), _train(global_batch=16,
                  pp_schedule="interleaved"), stage_split=StageSplit(first_layers=2))
    assert [s.layers for s in i.stages] == [(0, 1), (1, 2), (2, 3), (3, 4)]
    with pytest.raises(LayoutError, match="not divisible by vp=2"):
        _estimate(tiny, host, Parallel(pp=2, vp=2), _train(global_batch=16,
                  pp_schedule="interleaved"), stage_split=StageSplit(first_layers=1))


@pytest.mark.needs("zrt-nvidia")
def test_a_power_limited_clock_speeds_the_priced_step_not_the_mfu_peak(tiny, host) -> None:
    # compute.power_limited_clock 2: every compute rate doubles for the training step's
    # prices (whole-step graphs: the host does not bind this tiny model); the report still
    # divides by the datasheet bf16 peak (989.4 TFLOP/s on H100)
    h100 = host.hardware_spec("nvidia_h100_sxm")
    hot = evolve(h100, compute=evolve(h100.compute, power_limited_clock=2.0))
    parallel, train = Parallel(dp=2), _train()
    base = _estimate(tiny, host, parallel, train, hw=h100, cuda_graph="full")
    fast = _estimate(tiny, host, parallel, train, hw=hot, cuda_graph="full")
    assert base.peak_tflops == fast.peak_tflops == h100.compute.bf16_tflops
    assert fast.compute_s < base.compute_s and fast.step_time_s < base.step_time_s
    assert any("power-limited clock, 2 x" in n for n in fast.notes)
    assert not any("power-limited clock" in n for n in base.notes)


@pytest.mark.needs("zrt-nvidia")
def test_an_older_attention_kernel_slows_only_the_attention(tiny, host) -> None:
    # H100 rates FlashAttention-2 at 0.35 / 0.30 of peak against its own kernel's 0.66 /
    # 0.58: only the attention nodes change price; every other category is the same
    parallel, train = Parallel(dp=2), _train()
    own = _estimate(tiny, host, parallel, train, cuda_graph="full")
    fa2 = _estimate(tiny, host, parallel, train, cuda_graph="full", attention="flash2")
    assert fa2.compute_by_category_s["attention"] > own.compute_by_category_s["attention"]
    for category, seconds in own.compute_by_category_s.items():
        if category != "attention":
            assert fa2.compute_by_category_s[category] == seconds
    assert any("FlashAttention-2 kernels" in n for n in fa2.notes)


@pytest.mark.needs("zrt-nvidia")
def test_an_attention_kernel_without_a_published_rate_is_refused_or_falls_back(tiny,
                                                                                host) -> None:
    # the B200 pack rates no FlashAttention 1.x kernel: asked for it, the estimate refuses;
    # a record naming a FlashAttention-1 stack falls back to the device's own kernel
    parallel, train = Parallel(dp=2), _train()
    with pytest.raises(SpecError, match="nvidia_b200 has no published rate for attention "
                                        "kernel flash1"):
        _estimate(tiny, host, parallel, train, hw="nvidia_b200", attention="flash1")
    own = _estimate(tiny, host, parallel, train, hw="nvidia_b200")
    back = _estimate(tiny, host, parallel, train, hw="nvidia_b200", attention="flash1",
                     attention_fallback=True)
    assert back.step_time_s == own.step_time_s
    assert any("no published FlashAttention 1.x rate" in n for n in back.notes)
