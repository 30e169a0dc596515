"""FSDP / HSDP as large runs configure them (zrt_core.fsdp, docs/fsdp.md): the sharding plan's
groups and defaults, the memory each reshard choice keeps, bad settings refused in one line,
and the weak-scaling curve of zrt run --train --gpus."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from attrs import evolve

from zrt_core.cli.main import main
from zrt_core.errors import LayoutError, SpecError
from zrt_core.estimate.training import capture_for_training, estimate_training
from zrt_core.estimate.training.scaling import scaled_layouts, weak_scaling
from zrt_core.fsdp import ShardGroup, sharding_plan
from zrt_core.plugins import PluginHost, get_plugin_manager
from zrt_core.strategy import Parallel, TrainSpec

TINY = {"model_type": "gpt2", "n_embd": 64, "n_layer": 4, "n_head": 4, "n_inner": 256,
        "vocab_size": 128, "n_positions": 256}
MB, SEQ = 2, 64


def _train(**changes) -> TrainSpec:
    return evolve(TrainSpec(micro_batch=MB, global_batch=16, seq_len=SEQ), **changes)


# -- the plan -------------------------------------------------------------------------------


def test_torchtitan_default_keeps_parameters_gathered_under_a_pipeline() -> None:
    # Llama 3.1 405B's layout: tp 8, pp 16, dp 64
    plan = sharding_plan(Parallel(tp=8, pp=16, dp=64), _train(fsdp=True))
    assert (plan.reshard, plan.gather_once, plan.grads_per_microbatch) == ("none", True, False)
    # the shard group: 64 dp ranks strided by tp 8 over 8 × 64 = 512 consecutive ranks
    assert plan.shard == ShardGroup(64, 512)
    assert plan.replicas == 1
    # no pipeline: torchtitan re-shards, FSDP2 reduce-scatters every micro-batch
    flat = sharding_plan(Parallel(tp=8, dp=64), _train(fsdp=True))
    assert (flat.reshard, flat.gather_once, flat.grads_per_microbatch) == ("full", False, True)


def test_reshard_to_n_and_hsdp_groups() -> None:
    p = Parallel(tp=8, pp=16, dp=64)
    plan = sharding_plan(p, _train(fsdp=True, reshard_after_forward=8))
    # the backward gathers within 8 of the 64 shard ranks: 8 × stride 8 = 64 ranks
    assert (plan.reshard, plan.post_forward) == ("partial", ShardGroup(8, 64))
    assert plan.gather_once is False
    hsdp = sharding_plan(p, _train(fsdp=True, hsdp=8))
    # shard within 8 dp ranks (8 × tp 8 = 64 consecutive ranks), 64 / 8 = 8 replicas
    # whose all-reduce spans the 512 ranks of dp × tp
    assert (hsdp.shard, hsdp.replicas, hsdp.replica_span) == (ShardGroup(8, 64), 8, 512)
    # a re-shard group as large as the shard group is reshard=True, one rank is False
    assert sharding_plan(p, _train(fsdp=True, reshard_after_forward=64)).reshard == "full"
    assert sharding_plan(p, _train(fsdp=True, reshard_after_forward=1)).reshard == "none"


def test_zero3_keeps_deepspeeds_semantics() -> None:
    plan = sharding_plan(Parallel(tp=8, pp=16, dp=64), _train(zero=3))
    assert (plan.framework, plan.reshard, plan.gather_once, plan.grads_per_microbatch) == (
        "deepspeed", "full", False, True)


@pytest.mark.parametrize(("train", "error", "needle"), [
    (_train(fsdp=True, hsdp=7), LayoutError, "--hsdp 7 does not divide dp=64"),
    (_train(fsdp=True, reshard_after_forward=128), LayoutError,
     "128 is larger than the shard group's 64 ranks"),
    (_train(fsdp=True, hsdp=8, reshard_after_forward=16), LayoutError,
     "16 is larger than the shard group's 8 ranks"),
    (_train(fsdp=True, reshard_after_forward=3), LayoutError, "not a divisor"),
    (_train(zero=3, hsdp=8), SpecError, "--hsdp is an FSDP setting"),
    (_train(reshard_after_forward=False), SpecError, "--reshard-after-forward is an FSDP"),
])
def test_bad_settings_are_refused(train, error, needle) -> None:
    with pytest.raises(error, match=needle.replace("(", r"\(")):
        sharding_plan(Parallel(tp=8, pp=16, dp=64), train)


def test_reshard_value_is_checked_in_the_spec() -> None:
    with pytest.raises(SpecError):
        _train(fsdp=True, reshard_after_forward=0)
    with pytest.raises(SpecError):
        _train(fsdp=True, reshard_after_forward="yes")


# -- estimates on a tiny GPT-2 -----------------------------------------------------------------


@pytest.fixture(scope="module")
def host() -> PluginHost:
    return get_plugin_manager()


@pytest.fixture(scope="module")
def tiny(host: PluginHost):
    return capture_for_training(TINY, MB, SEQ, host=host, use_cache=False)


def _estimate(tiny, host, parallel: Parallel, train: TrainSpec):
    return estimate_training(TINY, "nvidia_h100_sxm", parallel, train, host=host,
                             captured=tiny)


@pytest.mark.needs("zrt-nvidia")
def test_memory_each_reshard_choice_keeps(tiny, host) -> None:
    p = Parallel(pp=2, dp=2)
    zero1 = _estimate(tiny, host, p, _train(zero=1)).memory
    keep = _estimate(tiny, host, p, _train(fsdp=True)).memory
    free = _estimate(tiny, host, p, _train(fsdp=True, reshard_after_forward=True)).memory
    assert keep.rank == zero1.rank == free.rank
    w, g = zero1.weights_bytes, zero1.gradients_bytes  # the stage's P × 2 B and P × 4 B
    # reshard off under a pipeline: the shard (P/2 × 2 B) and the gathered stage (P × 2 B);
    # gradients accumulate unsharded (P × 4 B) beside their shard (P/2 × 4 B)
    assert (keep.weights_bytes, keep.gradients_bytes) == (1.5 * w, 1.5 * g)
    assert keep.comm_buffer_bytes == 0
    # reshard on: only the shard, plus the gather buffers of two layers
    assert (free.weights_bytes, free.gradients_bytes) == (0.5 * w, 1.5 * g)
    assert free.comm_buffer_bytes > 0


@pytest.mark.needs("zrt-nvidia")
def test_gathering_once_per_step_is_no_slower_than_every_micro_batch(tiny, host) -> None:
    p = Parallel(pp=2, dp=2)
    t = _train(global_batch=32)
    once = _estimate(tiny, host, p, evolve(t, fsdp=True))
    every = _estimate(tiny, host, p, evolve(t, fsdp=True, reshard_after_forward=True))
    deepspeed = _estimate(tiny, host, p, evolve(t, zero=3))
    assert once.step_time_s <= every.step_time_s <= deepspeed.step_time_s
    assert any("one parameter all-gather per stage per step" in n for n in once.notes)
    # DeepSpeed's PipelineEngine asserts ZeRO stage < 2: the estimate says so (pp 2 here);
    # without a pipeline, or with --fsdp, nothing to say
    assert any("DeepSpeed's pipeline engine refuses ZeRO-2/3" in n for n in deepspeed.notes)
    assert not any("pipeline engine refuses" in n for n in once.notes)
    flat = _estimate(tiny, host, Parallel(dp=2), _train(zero=3))
    assert not any("pipeline engine refuses" in n for n in flat.notes)


@pytest.mark.needs("zrt-nvidia")
def test_hsdp_adds_the_replicas_all_reduce(tiny, host) -> None:
    p = Parallel(dp=4)
    full = _estimate(tiny, host, p, _train(fsdp=True))
    hsdp = _estimate(tiny, host, p, _train(fsdp=True, hsdp=2))
    # optimizer states sharded over 2, not 4 ranks: twice the bytes
    assert hsdp.memory.optimizer_bytes == 2 * full.memory.optimizer_bytes
    assert any("2 replicas all-reduce" in n for n in hsdp.notes)


# -- weak scaling -------------------------------------------------------------------------------


def test_scaled_layouts_keep_the_batch_per_replica() -> None:
    # 16 sequences over dp 2 = 8 per replica; tp × pp = 4 GPUs per replica
    out = scaled_layouts(Parallel(tp=2, pp=2, dp=2), _train(), [8, 16, 32])
    assert [(p.dp, t.global_batch) for p, t in out] == [(2, 16), (4, 32), (8, 64)]
    with pytest.raises(LayoutError, match="10 GPUs is not a multiple of"):
        scaled_layouts(Parallel(tp=2, pp=2, dp=2), _train(), [8, 10])
    with pytest.raises(LayoutError, match="increasing order"):
        scaled_layouts(Parallel(tp=2, pp=2, dp=2), _train(), [16, 8])


@pytest.mark.needs("zrt-nvidia")
def test_weak_scaling_never_gets_faster(tiny, host) -> None:
    curve, reports = weak_scaling(lambda p, t: _estimate(tiny, host, p, t), Parallel(dp=1),
                                  _train(global_batch=8), [1, 2, 4, 8, 16])
    assert [r.num_gpus for r in reports] == [1, 2, 4, 8, 16]
    assert curve.monotone and curve.batch_per_replica == 8
    assert curve.points[0].exposed_dp_s == curve.points[0].hidden_dp_s == 0.0
    dp_busy = [p.exposed_dp_s + p.hidden_dp_s for p in curve.points]
    assert dp_busy == sorted(dp_busy) and dp_busy[-1] > 0


# -- the command line ---------------------------------------------------------------------------


def _config(tmp_path: Path) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    return str(path)


def _one_error(argv, capsys) -> str:
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's own refusals
        rc = exc.code
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("zrt: error: ")]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, (rc, err)
    return lines[0]


@pytest.mark.needs("zrt-nvidia")
@pytest.mark.parametrize(("flags", "needle"), [
    (["--fsdp", "--hsdp", "3"], "--hsdp 3 does not divide dp=4"),
    (["--fsdp", "--reshard-after-forward", "8"], "larger than the shard group's 4 ranks"),
    (["--fsdp", "--reshard-after-forward", "sometimes"], "must be true, false or"),
    (["--gpus", "4,6"], "6 GPUs is not a multiple of"),
    (["--gpus", "4,8", "--emit", "megatron"], "--emit writes one run's config"),
    (["--gpus", "4,8", "--server", "http://localhost:1"], "--gpus is not available with"),
])
def test_bad_flags_are_one_line(tmp_path, capsys, flags, needle) -> None:
    argv = ["run", _config(tmp_path), "--hw", "h100", "--train", "--tp", "4", "--dp", "4",
            "--micro-batch", "2", "--seq-len", "64", "--global-batch", "16", *flags]
    if "--gpus" in flags:
        argv[argv.index("--dp") + 1] = "1"
        argv[argv.index("--global-batch") + 1] = "4"
    assert needle in _one_error(argv, capsys)


@pytest.mark.needs("zrt-nvidia")
def test_gpus_list_prints_the_curve_as_json(tmp_path, capsys) -> None:
    rc = main(["run", _config(tmp_path), "--hw", "h100", "--train", "--micro-batch", "2",
               "--seq-len", "64", "--global-batch", "4", "--gpus", "1-4", "--json"])
    data = json.loads(capsys.readouterr().out)["weak_scaling"]
    assert rc == 0
    # 1-4 doubles: 1, 2, 4 GPUs; 4 sequences per replica
    assert [(p["gpus"], p["dp"], p["global_batch"]) for p in data["points"]] == [
        (1, 1, 4), (2, 2, 8), (4, 4, 16)]
    assert data["monotone"] is True and data["points"][0]["efficiency"] == 1.0


# -- torchtitan job configs -------------------------------------------------------------------


def test_torchtitan_replicate_and_shard_degrees_are_hsdp() -> None:
    from zrt_core.frameworks import Header, emit, read_text, request_from_values

    got = read_text("torchtitan", """
[training]
local_batch_size = 8
seq_len = 4096
[parallelism]
data_parallel_replicate_degree = 4
data_parallel_shard_degree = 8
pipeline_parallel_degree = 2
fsdp_reshard_after_forward = "always"
[activation_checkpoint]
mode = "none"
""", {"layers": 32})
    request = request_from_values(got.values)
    # dp = replicate 4 × shard 8 = 32, sharded within the 8 (HSDP); "always" re-shards
    assert request.parallel.dp == 32
    assert (request.train.hsdp, request.train.reshard_after_forward) == (8, True)
    text = emit("torchtitan", request, Header(model="m", hardware="nvidia_h100_sxm", layers=32))
    assert "data_parallel_replicate_degree = 4" in text
    assert 'fsdp_reshard_after_forward = "always"' in text
    back = request_from_values(read_text("torchtitan", text, {"layers": 32}).values)
    assert back.normalized() == request.normalized()
    # "default" leaves zrt's default (torchtitan's: no re-shard under a pipeline)
    default = read_text("torchtitan", "[parallelism]\ndata_parallel_shard_degree = 8\n",
                        {"layers": 32})
    assert "reshard_after_forward" not in default.values
