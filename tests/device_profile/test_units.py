"""Units of the ground-truth chain that need no device: provenance lines and the pack a
calibration writes (the attention efficiency over its own dtype's GEMM rate)."""

from __future__ import annotations

import pytest
import torch
from attrs import evolve

from zrt_core.profile.calibrate import Calibration, GemmFit
from zrt_core.profile.device import Device


def test_provenance_names_device_threads_libraries_and_torch():
    version = torch.__version__
    assert Device("cpu", "EPYC", 1).provenance() == f"EPYC (cpu, 1 thread), torch {version}"
    assert Device("cpu", "EPYC", 4).provenance() == f"EPYC (cpu, 4 threads), torch {version}"
    gpu = Device("cuda", "NVIDIA H200", 0, "driver 580.159.04, CUDA 13.0")
    assert gpu.provenance() == ("NVIDIA H200 (cuda, driver 580.159.04, CUDA 13.0), torch "
                                f"{torch.__version__}")
    assert gpu.to_json()["libraries"] == "driver 580.159.04, CUDA 13.0"


def _calibration(attention_dtype: str) -> Calibration:
    fits = (GemmFit("fp32", 50e12, 64.0, 10e-6, 0.1, 32),
            GemmFit("bf16", 800e12, 128.0, 8e-6, 0.1, 64))
    attention = (GemmFit("attention_fwd", 600e12, 118.0, 5e-6, 0.1),
                 GemmFit("attention_bwd", 560e12, 90.0, 9e-6, 0.1))
    return Calibration(device=Device("cuda", "GPU", 0, "CUDA 13.0"), gemm=(), fits=fits,
                       attention=attention, memory_gb_per_s=4000.0, launch_overhead_us=6.5,
                       vector_flops=8e12, capacity_gb=141.0, date="2026-11-26",
                       attention_dtype=attention_dtype)


def test_attention_efficiency_is_over_the_gemm_rate_of_its_dtype():
    eff = _calibration("bf16").to_pack()["efficiency"]
    # 600 / 800 and 560 / 800 TFLOP/s: bf16 attention over the bf16 GEMM rate
    assert eff["attention"] == 0.75
    assert eff["attention_backward"] == 0.7
    # the dtype models run in (bf16, attention's) sets the GEMM rule: K overhead 128, row
    # tile 64, fixed 8 - 6.5 = 1.5 us
    assert (eff["matmul_k_overhead"], eff["matmul_tile_m"], eff["matmul_overhead_us"]) == (
        128, 64, 1.5)
    # timed in fp32 (a CPU's calibration), the fp32 fit sets it: 64, 32, 10 - 6.5 = 3.5 us
    eff32 = _calibration("fp32").to_pack()["efficiency"]
    assert (eff32["matmul_k_overhead"], eff32["matmul_tile_m"],
            eff32["matmul_overhead_us"]) == (64, 32, 3.5)
    # vector: 8e12 / 50e12 (the fp32 rate)
    assert eff["vector"] == 0.16
    # over the fp32 rate (50 TFLOP/s) the same kernel is more than the peak: capped at 1
    assert _calibration("fp32").to_pack()["efficiency"]["attention"] == 1.0
    assert "attention in bf16" in _calibration("bf16").to_pack()["source"]


def test_profile_collects_one_tensor_parallel_ranks_gemms(tmp_path, monkeypatch):
    from zrt_core.capture.api import capture
    from zrt_core.plugins import get_plugin_manager
    from zrt_core.profile.kernels import kernels_of
    from zrt_core.profile.layout import rank_graphs

    monkeypatch.setenv("ZRT_CACHE_DIR", str(tmp_path))
    host = get_plugin_manager()
    config = dict(model_type="llama", hidden_size=64, intermediate_size=128,
                  num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                  vocab_size=128)
    phases = ("train_forward", "train_backward")
    captured = capture(config, phases, batch=1, seq_len=16, host=host)
    from zrt_core.hardware import HardwareSpec

    hw = HardwareSpec.from_mapping(_calibration("bf16").to_pack(), source_file="cal.yaml")

    def gemms(graphs):
        kernels, _ = kernels_of(graphs, grid=False)
        return {dict(k.cells)["n"] for k in kernels if k.op == "gemm"} | {
            dict(k.cells)["k"] for k in kernels if k.op == "gemm"}

    whole = gemms([captured.graph(p) for p in phases])
    rank = gemms(rank_graphs(captured, phases, hw, host, tp=2, cp=1, ep=1, batch=1,
                             seq_len=16, dtype="float32"))
    # n and k of every GEMM, forward and backward: 16 tokens (the weight gradients' k), 64
    # hidden and q (4 heads x 16), 32 k/v (2 heads x 16), 128 the MLP's intermediate and the
    # vocabulary
    assert whole == {16, 32, 64, 128}
    # at tp 2 each rank holds half of every column- and row-parallel weight: intermediate and
    # vocabulary 64, q 32, k/v 16 (one head each)
    assert rank == {16, 32, 64}


def test_the_eager_host_runs_beside_a_gpu_and_before_each_op_on_a_cpu():
    from zrt_core.profile.diff import HostClock

    us = 1e-6
    per_node = {"forward": 10 * us, "backward": 2 * us, "infer": 4 * us}
    # GPU: the host issues each op in 10 us, the device runs a priced op less its 5 us
    # dispatch. A 105 us kernel (100 us own) issued at 10 ends at 110; a view is issued at
    # 20 (no device work); a 9 us kernel (4 us own) issued at 30 waits for the device: 110
    # to 114; three 6 us kernels (1 us own) issued at 40, 50, 60 start at 114, 115, 116 and
    # end at 117: the device is busy, the host is not what bounds
    gpu = HostClock(per_node, serial=False, dispatch_s=5 * us)
    assert gpu.start("forward") == 0.0
    moves = [gpu.advance(105 * us), gpu.advance(0.0), gpu.advance(9 * us),
             gpu.advance(6 * us, copies=3)]
    assert [round(m / us, 9) for m in moves] == [110, 0, 4, 3]
    # a backward 1 us kernel has no own time left after the 5 us dispatch (floored at 0);
    # issued at 60 + 2 = 62, it runs at 117 and moves nothing
    gpu.start("backward")
    assert gpu.advance(1 * us) == 0.0
    # CPU: the host thread runs each op after its 10 us: 10 + 100, 10, 10 + 4
    cpu = HostClock(per_node, serial=True, dispatch_s=5 * us)
    cpu.start("forward")
    moves = [cpu.advance(105 * us), cpu.advance(0.0), cpu.advance(9 * us)]
    assert [round(m / us, 9) for m in moves] == [110, 10, 14]
    assert round(cpu.device / us, 9) == 134


def test_a_pass_pays_its_fixed_host_cost_once_and_its_own_cost_per_op():
    from zrt_core.profile.diff import HostClock, host_pass

    us = 1e-6
    assert [host_pass(p) for p in ("train_forward", "train_backward", "prefill", "decode")] \
        == ["forward", "backward", "infer", "decode"]
    per_node = {"forward": 10 * us, "backward": 2 * us, "infer": 4 * us}
    fixed = {"forward": 50 * us, "backward": 0.0, "infer": 30 * us}
    # CPU: an inference pass starts with its 30 us, then 4 us of host before each op:
    # 30, then 4 + 20 own (25 priced less the 5 us dispatch), then 4 for a view
    cpu = HostClock(per_node, serial=True, dispatch_s=5 * us, fixed=fixed)
    moves = [cpu.start("infer"), cpu.advance(25 * us), cpu.advance(0.0)]
    assert [round(m / us, 9) for m in moves] == [30, 24, 4]
    # GPU: the 30 us put the host behind; the first kernel is issued at 30 + 4 = 34 and
    # ends at 34 + 20 = 54; the host is then at 34, so the second (issued at 38) waits for
    # the device: 54 + 20 = 74
    gpu = HostClock(per_node, serial=False, dispatch_s=5 * us, fixed=fixed)
    moves = [gpu.start("infer"), gpu.advance(25 * us), gpu.advance(25 * us)]
    assert [round(m / us, 9) for m in moves] == [0, 54, 20]
    # a pass that starts while the device still runs: the host, at 38, waits for no
    # kernel: its 50 us take it to 88, the next op is issued at 98 and ends at 118, 44
    # after the device's 74
    assert gpu.start("forward") == 0.0
    assert round(gpu.advance(25 * us) / us, 9) == 44


def test_the_host_line_splits_a_probe_into_per_op_and_fixed_costs():
    from zrt_core.profile.host_probe import EagerHost, host_line

    # 2 layers: 175 nodes in 2,000 us; 6 layers: 455 nodes in 3,400 us: (3,400 - 2,000) /
    # (455 - 175) = 5 us per node, and 2,000 - 175 x 5 = 1,125 us once per pass
    per_node, fixed = host_line([2000e-6, 3400e-6], [175, 455])
    assert (round(per_node, 9), round(fixed, 9)) == (5.0, 1125.0)
    # a line through zero nodes below zero time: no fixed cost
    assert host_line([100e-6, 1000e-6], [10, 40])[1] == 0.0
    # the deeper probe no slower (noise): its average, 1,900 / 455 us per node, no fixed
    per_node, fixed = host_line([2000e-6, 1900e-6], [175, 455])
    assert (round(per_node, 9), fixed) == (round(1900 / 455, 9), 0.0)
    keys = EagerHost((5.0, 2.0, 4.0, 3.0), (1125.0, 0.0, 60.0, 50.0)).to_efficiency()
    assert keys == {"eager_host_us": 5.0, "eager_host_backward_us": 2.0,
                    "eager_host_infer_us": 4.0, "eager_host_decode_us": 3.0,
                    "eager_host_fixed_us": 1125.0, "eager_host_backward_fixed_us": 0.0,
                    "eager_host_infer_fixed_us": 60.0, "eager_host_decode_fixed_us": 50.0}
    # a calibration saved before the decode probe (0 per node) writes no decode keys
    assert "eager_host_decode_us" not in EagerHost((5.0, 2.0, 4.0, 0.0),
                                                   (1125.0, 0.0, 60.0, 0.0)).to_efficiency()


def test_a_decode_step_pays_the_decode_probes_host_cost_else_the_inference_passes():
    from zrt_core.hardware import HardwareSpec
    from zrt_core.profile.diff import host_clock

    base = _calibration("bf16").to_pack()
    eff = {**base["efficiency"], "eager_host_us": 10.0, "eager_host_infer_us": 8.0,
           "eager_host_infer_fixed_us": 40.0}
    gpu = {"device": {"kind": "cuda"}}
    # no decode probe in the pack (written before it): a decode step pays the inference
    # forward's 8 us per node and 40 us per pass
    old = host_clock(gpu, HardwareSpec.from_mapping({**base, "efficiency": eff}))
    assert (round(old.per_node["decode"] * 1e6, 9), round(old.fixed["decode"] * 1e6, 9)) == (
        8.0, 40.0)
    # with it, its own: 6 us and 30 us
    new = host_clock(gpu, HardwareSpec.from_mapping({**base, "efficiency": {
        **eff, "eager_host_decode_us": 6.0, "eager_host_decode_fixed_us": 30.0}}))
    assert (round(new.per_node["decode"] * 1e6, 9), round(new.fixed["decode"] * 1e6, 9)) == (
        6.0, 30.0)


def test_the_ring_fit_recovers_the_link_that_made_the_times():
    import pytest

    from zrt_core.profile.collectives import fit_ring

    # 4 ranks on a 10 GB/s link with 5 us per ring step: t = 2·3/4·S / 10e9 + 2·3 · 5 us,
    # 180 us at 1 MB and 630 us at 4 MB
    link = fit_ring([(1_000_000, 180e-6), (4_000_000, 630e-6)], ranks=4, backend="gloo")
    assert link.bandwidth_gb_per_s == pytest.approx(10.0)
    assert link.latency_us == pytest.approx(5.0)
    assert link.rms_rel_error == pytest.approx(0.0, abs=1e-12)


def test_a_link_needs_two_ranks_and_the_gpus_it_names():
    import pytest

    from zrt_core.profile.collectives import measure_link
    from zrt_core.profile.device import DeviceError

    with pytest.raises(DeviceError, match="2 ranks at least"):
        measure_link("cpu", 1)
    with pytest.raises(DeviceError, match=r"GPU\(s\)"):
        measure_link("cuda", 1024)


def test_profile_gemms_run_tn_on_weights_cycled_past_the_cache():
    from zrt_core.profile.kernels import _gemm, weight_copies

    # 256 MB of copies: a 4096 x 4096 bf16 weight (33,554,432 bytes) needs
    # ceil(256e6 / 33,554,432) = 8; a 16384 x 16384 one (536,870,912 bytes) is past it
    # alone: 1; a 64 x 64 one (8,192 bytes) would need 31,250 and is capped at 64
    assert weight_copies(4096 * 4096 * 2) == 8
    assert weight_copies(16384 * 16384 * 2) == 1
    assert weight_copies(64 * 64 * 2) == 64
    # F.linear's layout: activations [m, k] times the weight [n, k] transposed -> [m, n]
    call = _gemm("mm", "float32", 1, 3, 5, 7, "model").build(Device("cpu", "EPYC", 1))
    outs = [call() for _ in range(3)]
    assert all(o.shape == (3, 5) for o in outs)
    assert torch.equal(outs[0], outs[2])  # every copy holds the same weight


def test_a_gpu_rows_source_names_the_sm_clock_it_ran_at(tmp_path, monkeypatch):
    import csv

    from zrt_core.profile import kernels

    # a GEMM loop runs at the power-capped clock, a mixed step at the boost clock
    # (docs/profile.md): a GPU row says which; a CPU, or a GPU without NVML, says nothing
    assert Device("cpu", "EPYC", 1).sm_clock_mhz() is None
    gpu = Device("cuda", "NVIDIA H200", 0, "CUDA 13.0")
    monkeypatch.setattr(torch.cuda, "clock_rate", lambda device=None: 1440)
    assert gpu.sm_clock_mhz() == 1440

    def no_nvml(device=None):
        raise ModuleNotFoundError("pynvml")

    monkeypatch.setattr(torch.cuda, "clock_rate", no_nvml)
    assert gpu.sm_clock_mhz() is None
    monkeypatch.setattr(torch.cuda, "clock_rate", lambda device=None: 1440)
    monkeypatch.setattr(kernels, "time_call", lambda *a, **k: (2.5e-4,))
    from attrs import evolve

    # the row's cells as zrt profile writes them; nothing runs (no GPU here)
    gemm = evolve(kernels._gemm("gemm", "bfloat16", 1, 64, 64, 64, "model"),
                  build=lambda device: (lambda: None))
    rows = list(kernels.profile([gemm], gpu, tmp_path / "t.csv", "nvidia_h200"))
    assert rows[0]["time_us"] == "250"
    assert rows[0]["source"].endswith("; model; sm 1440 MHz")
    with open(tmp_path / "t.csv", encoding="utf-8", newline="") as fh:
        assert next(iter(csv.DictReader(fh)))["source"] == rows[0]["source"]


def test_the_unaligned_row_fractions_are_geometric_means_over_the_aligned_rates():
    from zrt_core.profile.calibrate import fit_alignment

    def row(gemm, align, tflops, tokens=8):
        return {"gemm": gemm, "tokens": tokens, "hidden": 4, "row_alignment_bytes": align,
                "tflops": tflops}

    points = [row("fwd", 16, 100.0), row("fwd", 16, 400.0),  # aligned: geometric mean 200
              row("fwd", 4, 50.0), row("fwd", 8, 200.0),      # 0.25 and 1 -> 0.5
              row("fwd", 2, 20.0),                            # 0.1
              row("dw", 16, 10.0), row("dw", 2, 40.0),        # 4, capped at 1 below
              row("fwd", 2, 1.0, tokens=9)]                   # no aligned reference: skipped
    # 2 bytes: sqrt(0.1 x 4) = 0.632; 4-8 bytes: sqrt(0.25 x 1) = 0.5
    assert fit_alignment(points) == {"matmul_unaligned_8b": 0.5, "matmul_unaligned_2b": 0.632}
    assert fit_alignment([row("dw", 16, 10.0), row("dw", 2, 40.0)]) == {
        "matmul_unaligned_2b": 1.0}
    assert fit_alignment([row("fwd", 16, 10.0)]) == {}


def test_a_gpu_sample_queues_calls_for_the_time_one_call_takes():
    from zrt_core.profile.device import MAX_QUEUED_CALLS, calls_per_sample

    # a 20 ms GEMM and a 10 ms sample: one call (not a launch queue's worth)
    assert calls_per_sample(0.020, 0.010) == 1
    # 3 µs kernels: ceil(10 ms / 3 µs) = 3,334, capped well below the launch queue's depth
    assert calls_per_sample(3e-6, 0.010) == MAX_QUEUED_CALLS == 256
    # 50 µs: ceil(10 ms / 50 µs) = 200
    assert calls_per_sample(50e-6, 0.010) == 200
    # min_time 0 (a single timed call per sample), and an event that read zero
    assert calls_per_sample(0.001, 0.0) == 1
    assert calls_per_sample(0.0, 0.010) == MAX_QUEUED_CALLS


def test_the_gpu_sleeps_past_the_host_queueing_a_sample():
    from zrt_core.profile.device import sleep_cycles

    # 256 calls queued in 5 ms at 1.98 GHz: 2 × 5 ms × 1.98e9 = 19.8M cycles
    assert sleep_cycles(5e-3, 1.98e9) == 19_800_000
    # a big GEMM's single call queued in 20 µs: the 1 ms floor, 1.98M cycles
    assert sleep_cycles(20e-6, 1.98e9) == 1_980_000


def test_a_timed_decode_step_finds_its_cache_contiguous_after_the_crop():
    from transformers import DynamicCache

    from zrt_core.profile.measure import steady_cache

    cache = DynamicCache()
    # one layer, 6 cached tokens of batch 1, 2 KV heads, head size 4; then one decode step's
    # cat and the crop zrt measure runs before each timed step: a strided view of 6 of 7
    key = torch.randn(1, 2, 6, 4)
    cache.update(key, key.clone(), 0)
    cache.update(torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4), 0)
    cache.crop(-1)
    layer = cache.layers[0]
    assert not layer.keys.is_contiguous() and layer.keys.stride() == (56, 28, 4, 1)
    steady_cache(cache)
    assert layer.keys.is_contiguous() and layer.values.is_contiguous()
    assert cache.get_seq_length() == 6 and torch.equal(layer.keys, key)


def test_the_group_row_overhead_is_the_median_over_the_probes():
    from zrt_core.profile.calibrate import fit_group_rows

    # m0 = rows · (grouped / dense − 1): 32 · 0.5 = 16, 64 · 0.3 = 19.2, 128 · 0.1 = 12.8
    points = [{"rows": 32, "grouped_us": 150.0, "dense_us": 100.0},
              {"rows": 64, "grouped_us": 130.0, "dense_us": 100.0},
              {"rows": 128, "grouped_us": 110.0, "dense_us": 100.0}]
    assert fit_group_rows(points) == 16
    # a grouped kernel as fast as the dense one: no overhead; nothing timed: None
    assert fit_group_rows([{"rows": 64, "grouped_us": 90.0, "dense_us": 100.0}]) == 0
    assert fit_group_rows([]) is None


def test_the_gemm_fit_tells_a_row_overhead_from_a_row_tile():
    from zrt_core.profile.calibrate import GemmPoint, fit_gemm

    # calibrate's grid: s × s × k over the sizes, and skinny rows at the largest n = k (the
    # weight's size varies, so a per-row overhead is not a fixed cost in disguise)
    sizes = (64, 128, 256, 512)
    shapes = [(s, s, k) for s in sizes for k in sizes] + [(m, 512, 512) for m in (1, 2, 4, 8)]
    # timings made as m + 12 rows at 100 GFLOP/s plus 5 µs: 2·(m + 12)·n·k / 1e11 + 5e-6
    rows = [GemmPoint("fp32", m, n, k, 2 * (m + 12) * n * k / 1e11 + 5e-6)
            for m, n, k in shapes]
    fit = fit_gemm("fp32", rows)
    assert (fit.row_overhead, fit.tile_m) == (12, 1)
    assert fit.rate_flops == pytest.approx(1e11, rel=1e-6)
    assert fit.fixed_s == pytest.approx(5e-6, rel=1e-6)
    # and as 16-row tiles: ceil(m / 16)·16 rows
    tiled = [GemmPoint("fp32", m, n, k, 2 * -(-m // 16) * 16 * n * k / 1e11 + 5e-6)
             for m, n, k in shapes]
    fit = fit_gemm("fp32", tiled)
    assert (fit.row_overhead, fit.tile_m) == (0, 16)


def test_a_gemm_streams_its_weight_at_the_fastest_skinny_rate_over_the_copy():
    from zrt_core.profile.calibrate import Calibration, GemmFit, GemmPoint

    fit = GemmFit(dtype="fp32", rate_flops=1e11, k0=0.0, fixed_s=5e-6, rms_rel_error=0.1)
    # a 1024 × 1024 fp32 weight is 4,194,304 bytes: at 2 rows in 490 µs it streams at
    # 8.56 GB/s, at 4 in 512 µs 8.19, at 8 in 614 µs 6.83; one row (a GEMV) and 16 rows
    # are left out; over the copy's 25 GB/s: 4194304 / 490e-6 / 25e9 = 0.3424
    gemm = [GemmPoint("fp32", m, 1024, 1024, t * 1e-6)
            for m, t in ((1, 280), (2, 490), (4, 512), (8, 614), (16, 725))]
    gemm.append(GemmPoint("fp32", 512, 512, 512, 3e-3))
    cal = Calibration(device=Device(kind="cpu", name="toy", threads=1), gemm=gemm,
                      fits=(fit,), attention=(fit, fit), memory_gb_per_s=25.0,
                      launch_overhead_us=2.0, vector_flops=1e9, capacity_gb=16.0,
                      date="2026-11-27")
    # one weight only (a calibration saved before the stream probes): the fastest rate at
    # it, no per-row term
    fraction, k0 = cal.gemm_stream()
    assert (fraction, k0) == (pytest.approx(4194304 / 490e-6 / 25e9, rel=1e-12), 0)
    assert cal.to_pack()["efficiency"]["matmul_memory"] == 0.3424
    assert "matmul_memory_k_overhead" not in cal.to_pack()["efficiency"]
    # on a GPU models run in bf16 (attention's dtype): its skinny rows, 2 bytes an element,
    # set the rate. A 1024 × 1024 bf16 weight is 2,097,152 bytes; at 2 rows in 200 µs:
    # 10.49 GB/s, over 25 GB/s: 0.4194 (the fp32 rows at 490 µs would say 0.3424)
    bf16 = evolve(fit, dtype="bf16")
    gpu = evolve(cal, fits=(fit, bf16), attention_dtype="bf16",
                 gemm=[*gemm, *(GemmPoint("bf16", m, 1024, 1024, t * 1e-6)
                               for m, t in ((2, 200), (4, 230), (8, 260)))])
    assert gpu.to_pack()["efficiency"]["matmul_memory"] == 0.4194
    # no decode attention timed: the pack says nothing of it; 12.5 GB/s of KV cache
    # streamed over the 25 GB/s copy: 0.5
    assert "attention_decode_memory" not in cal.to_pack()["efficiency"]
    timed = evolve(cal, decode_attention_bytes_per_s=12.5e9)
    assert timed.to_pack()["efficiency"]["attention_decode_memory"] == 0.5


def test_the_weight_stream_fit_recovers_the_rate_and_each_rows_overhead():
    from zrt_core.profile.gemm_fit import GemmPoint, fit_weight_stream, grid_points

    # fp32 weights n = k streamed as t = 5 us + n·(k + 200)·4 / 12 GB/s; the 8-row times are
    # slower (compute shares them) and one row faster (a GEMV): both left out of the fit
    def t(n: int, k: int) -> float:
        return 5e-6 + n * (k + 200) * 4 / 12e9

    points = [GemmPoint("fp32", m, s, s, t(s, s) * (1.3 if m == 8 else 1.0))
              for s in (256, 512, 1024, 2048) for m in (2, 4, 8)]
    points.append(GemmPoint("fp32", 1, 2048, 2048, t(2048, 2048) / 2))
    fraction, k0 = fit_weight_stream(points, 4, 24e9)
    # 12 GB/s over the copy's 24: 0.5; k0 200
    assert (fraction, k0) == (pytest.approx(0.5, rel=1e-9), 200)
    # the compute fit's grid keeps square m = n GEMMs and the largest weight's skinny rows,
    # not the probes over smaller weights
    grid = [GemmPoint("fp32", s, s, k, 1e-3) for s in (256, 2048) for k in (256, 2048)]
    kept = grid_points(grid + points, "fp32")
    assert sorted((p.m, p.n, p.k) for p in kept) == sorted(
        [(p.m, p.n, p.k) for p in grid]
        + [(m, 2048, 2048) for m in (1, 2, 4, 8)])



def test_coverage_names_a_dtype_the_tables_do_not_hold():
    from zrt_core.cli.coverage_view import dtype_hint

    def cov(measured: float, *dtypes: str) -> dict:
        return {"ops": {"measured": measured, "interpolated": 0.0, "roofline": 1 - measured},
                "time": {"measured": measured, "interpolated": 0.0,
                         "roofline": 1 - measured},
                "misses": [{"dtype": d} for d in dtypes]}

    held = frozenset({"float32"})
    # a float32 profile beside a bf16 estimate: nothing priced from it, one line says why
    # (integer ops, an embedding's ids, are not named)
    assert dtype_hint(cov(0.0, "bfloat16", "int64"), held) == (
        "the tables' rows are float32; this estimate's missed ops are bfloat16 (profile with "
        "--dtype bfloat16, or run in the tables' precision)")
    # a miss in a dtype the tables hold (a shape they lack), or half the time from them:
    # no line
    assert dtype_hint(cov(0.0, "bfloat16", "float32"), held) is None
    assert dtype_hint(cov(0.6, "bfloat16"), held) is None
    assert dtype_hint(cov(0.0, "bfloat16"), None) is None
