"""estimate_inference on a tiny llama and a toy GPU: exact rescaling, memory from the
per-rank graphs, the throughput identities of both modes, trtllm-bench's batching rules,
and a model that does not fit.

Tiny llama: hidden 128, FFN 256, 4 heads of 32 (2 KV heads, 64 wide), 2 layers, vocab
512, bf16. Parameters: per layer q 128·128 + k, v 128·64 each + o 128·128 + gate, up, down
3·128·256 + 2 norms of 128 = 147712; embedding and head 512·128 each; final norm 128:
426624 in all, 853248 bytes.
"""

from __future__ import annotations

from typing import Any

import pytest

from zrt_core.estimate import CapturedModel, estimate_inference
from zrt_core.estimate.engine import (
    cuda_graph_batch,
    cuda_graph_sizes,
    engine_profile,
    trtllm_bench_settings,
)
from zrt_core.estimate.memory import cache_states, kv_cache_size, weights_bytes
from zrt_core.estimate.serving import PagedKVCache, Rescale
from zrt_core.hardware import HardwareSpec
from zrt_core.ir.graph import Category
from zrt_core.plugins import get_plugin_manager
from zrt_core.strategy import InferSpec, Parallel

LLAMA = dict(model_type="llama", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, vocab_size=512)
_CACHE: dict[str, Any] = {}


def _toy(capacity_gb: float = 4.0) -> HardwareSpec:
    return HardwareSpec.from_mapping({
        "id": "toy_gpu", "name": "Toy GPU", "vendor": "toy",
        "compute": {"fp32": 10, "bf16": 100, "fp16": 100, "fp8": 200},
        "memory": {"capacity_gb": capacity_gb, "bandwidth_gb_per_s": 1000},
        "interconnect": [{"name": "link", "bandwidth_gb_per_s": 100, "latency_us": 2,
                          "devices": 8},
                         {"name": "net", "bandwidth_gb_per_s": 25, "latency_us": 5,
                          "devices": None}],
        "efficiency": {"matmul": 0.8, "memory": 0.8, "launch_overhead_us": 2}})


@pytest.fixture(scope="module")
def host():
    return get_plugin_manager(autoload=False)


@pytest.fixture(scope="module")
def captured(host) -> CapturedModel:
    if "cap" not in _CACHE:
        from zrt_core.capture.api import capture

        result = capture(LLAMA, phases=("prefill", "decode"), batch=1, seq_len=32, host=host)
        _CACHE["cap"] = CapturedModel.from_capture(result)
    return _CACHE["cap"]


def _flops(g, category: str) -> int:
    return sum(n.flops * g.multiplicity(n) for n in g.nodes if n.category == category)


def test_rescale_is_exact_for_batch_and_cache_length(captured):
    pre, dec = captured.graph("prefill"), captured.graph("decode")
    pre6 = Rescale(batch=6).apply(pre, None)
    assert pre6.meta["batch"] == 6
    # every token-proportional count scales by 6, attention (per sequence) too
    assert _flops(pre6, Category.MATMUL) == 6 * _flops(pre, Category.MATMUL)
    assert _flops(pre6, Category.ATTENTION) == 6 * _flops(pre, Category.ATTENTION)
    dec = Rescale(batch=3, cache_len=64).apply(dec, None)
    att0 = sum(n.flops for n in captured.graph("decode").nodes
               if n.category == Category.ATTENTION)
    att = sum(n.flops for n in dec.nodes if n.category == Category.ATTENTION)
    # one query against 32 cached + 1 keys -> 3 sequences against 64 + 1: 3 * 65 / 33
    assert att * 33 == att0 * 3 * 65
    q = next(n for n in dec.nodes if n.module_path.endswith("q_proj") and
             n.category == Category.MATMUL)
    assert q.inputs[0].shape == (3, 128)


def test_paged_cache_writes_only_the_new_token(captured):
    dec = captured.graph("decode")
    paged = PagedKVCache().apply(dec, None)
    writes = [n for n in paged.nodes if n.op == "zrt.kv_cache_write"]
    assert len(writes) == 2 and {n.layer_index for n in writes} == {0}
    # one token x 2 KV heads x 32 x 2 bytes, read and written
    assert {(n.bytes_read, n.bytes_written) for n in writes} == {(128, 128)}


def test_memory_from_per_rank_graphs(host, captured):
    from zrt_core.estimate.inference import _Estimator
    from zrt_core.strategy import check_layout

    infer = InferSpec(input_len=32, output_len=32, batch=1)
    for tp, weights, kv in ((1, 853_248, 512), (2, 427_264, 256)):
        est = _Estimator(captured, _toy(), check_layout(Parallel(tp=tp), captured.dims),
                         infer, host, "trtllm")
        graphs = [est.graph("prefill", 1), est.graph("decode", 1, 32, kernels=False)]
        # tp=2 halves every split weight; the two norms per layer and the final norm stay
        assert weights_bytes(graphs) == weights
        # KV per token: 2 layers x (K and V) x 2 heads x 32 x 2 bytes = 512; half per rank
        states = cache_states(captured.graph("decode"), captured.graph("prefill"))
        size = kv_cache_size(graphs[1], caches=states)
        assert (size.per_token, size.per_sequence_fixed) == (kv, 0)


def test_latency_mode_identities(host, captured):
    infer = InferSpec(input_len=32, output_len=16, batch=4)
    r = estimate_inference(None, _toy(), Parallel(tp=2), infer, host=host, captured=captured)
    assert r.mode == "latency" and r.batch == 4 and r.num_gpus == 2
    # throughput = batch x output / (TTFT + (output - 1) x TPOT), per GPU over 2 devices
    expected = 4 * 16 / (r.ttft_s + 15 * r.tpot_s)
    assert r.output_tokens_per_s == pytest.approx(expected, rel=1e-12)
    assert r.output_tokens_per_s_per_gpu == pytest.approx(expected / 2, rel=1e-12)
    assert r.prefill.batch == 4 and r.prefill.tokens == 4 * 32
    assert r.prefill.time_s == pytest.approx(r.ttft_s)
    assert r.decode.time_s == pytest.approx(r.tpot_s)
    assert "tp/all_reduce" in r.decode.collectives
    assert r.fits and r.memory.kv_per_token == 256
    data = r.to_json()
    for key in ("ttft_ms", "tpot_ms", "output_tokens_per_s", "output_tokens_per_s_per_gpu",
                "memory_gib_per_device", "max_batch"):
        assert data[key] is not None
    # one convention with the training report: GiB, num_gpus
    assert data["num_gpus"] == 2 and "world_size" not in data
    assert data["memory_gib_per_device"] == pytest.approx(r.memory.total_in_use / 2**30)
    assert all(k.endswith(("_gib", "_bytes", "_per_token", "_per_sequence"))
               for k in data["memory"] if k not in ("fits", "message", "kv_by_layer_kind"))
    # dp replicas multiply throughput, not latency
    r2 = estimate_inference(None, _toy(), Parallel(tp=2, dp=3), infer, host=host,
                            captured=captured)
    assert r2.output_tokens_per_s == pytest.approx(3 * r.output_tokens_per_s, rel=1e-12)
    assert r2.tpot_s == pytest.approx(r.tpot_s, rel=1e-12)


def test_max_throughput_batch_is_limited_by_memory_and_engine(host, captured):
    infer = InferSpec(input_len=32, output_len=32)
    r = estimate_inference(None, _toy(1.6), Parallel(), infer, host=host, captured=captured)
    mem = r.memory
    # 1.6 GiB; the cache gets 0.9 of what weights, activations and the 1.5 GiB reserve
    # leave; a sequence holds whole 32-token blocks: 64 tokens x 512 bytes = 32768
    assert mem.kv_per_sequence == 32_768
    assert r.max_batch == int(mem.kv_budget // 32_768)
    assert r.batch == min(r.max_batch, r.throughput["engine_max_batch"])
    assert r.batch == r.max_batch < r.throughput["engine_max_batch"]  # memory-limited here
    assert r.throughput["concurrency"] == r.batch
    # steady state: per period, each slot prefills a prompt and emits output_len tokens
    t = r.throughput
    period = t["period_ms"] / 1e3
    assert r.output_tokens_per_s == pytest.approx(r.batch * 32 / period, rel=1e-9)


def test_prompt_admission_bounds_the_busy_sequences():
    from zrt_core.estimate.iterations import admission_limited, prompt_chunk

    # TensorRT-LLM 2048/128 on one H200 (70B): 3584 tokens a step, 193 sequences fit.
    # Beside 193 decoding sequences 3391 tokens are free: one whole 2048-token prompt
    # (chunked context off), and 193 prompts would need 193 > 128 iterations of it.
    assert prompt_chunk(193, 3584, 2048, False) == 2048
    # n x 2048 <= 128 x chunk(n): chunk stays 2048 down to n = 1536 (3584 - 1536 = 2048),
    # so n <= 128 x 2048 / 2048 = 128
    assert admission_limited(193, 3584, 2048, 128, False) == 128
    # 128/128 with room to spare: 100 sequences, 3484 free -> 27 prompts = 3456 tokens a
    # step; 100 x 128 = 12800 <= 128 x 3456, nothing changes
    assert admission_limited(100, 3584, 128, 128, False) == 100
    # chunked prefill splits prompts: chunk = min(free, n x isl) = 3391, and
    # 193 x 2048 = 395264 <= 128 x 3391 = 434048 -> all 193 stay busy
    assert admission_limited(193, 3584, 2048, 128, True) == 193


def _toy_engine():
    """An engine of at most 4 sequences and 60 tokens a step, whole prompts."""
    from zrt_core.estimate.engine import EngineProfile

    return EngineProfile(name="toy", kv_fraction=0.9, runtime_reserve_gib=0.0,
                         kv_block_tokens=32, fixed_max_batch=4, fixed_max_tokens=60,
                         chunked_prefill=False)


def test_admission_limited_steady_state_identity(host, captured):
    # 4 sequences, 60 tokens a step, whole prompts: 4 x (1 + 32/3) = 46.7 <= 60 tokens, so
    # the token budget allows 4; beside 4 decoding sequences 56 tokens are free, one
    # 32-token prompt a step, and 4 prompts need 4 > 3 steps: 3 sequences run
    # (3 x 32 = 96 <= 3 x 32), every iteration mixed
    engine = _toy_engine()
    r = estimate_inference(None, _toy(), Parallel(), InferSpec(input_len=32, output_len=3),
                           host=host, captured=captured, engine=engine)
    t = r.throughput
    assert t["prompt_admission_limited"] and not t["token_budget_limited"]
    assert (t["concurrency"], t["prompt_tokens_per_mixed_iteration"]) == (3, 32)
    assert t["mixed_iterations_per_period"] == 3
    # period = 3 mixed iterations; 3 sequences x 3 tokens in it
    assert r.output_tokens_per_s == pytest.approx(9 / (t["period_ms"] / 1e3), rel=1e-9)
    assert t["period_ms"] == pytest.approx(3 * t["mixed_iteration_ms"], rel=1e-9)


def test_cuda_graph_sizes_keep_what_the_engine_can_capture():
    perf = engine_profile("trtllm").cuda_graph_batch_sizes
    # Qwen3-235B 128/2048 on 8 H200 runs with max batch 2304 and 2432 tokens a step: 4096
    # and 8192 exceed min(2304, 2432) = 2304, which is kept in their place
    assert cuda_graph_sizes(perf, max_batch=2304, max_num_tokens=2432)[-3:] == \
        (1024, 2048, 2304)
    # a bound that is a configured size is kept once
    assert cuda_graph_sizes(perf, max_batch=2048, max_num_tokens=8192)[-2:] == (1024, 2048)
    # every configured size over the bound: the bound alone
    assert cuda_graph_sizes((256, 512), max_batch=100, max_num_tokens=8192) == (100,)
    # the token budget binds with draft tokens: 2048 // (1 + 3) = 512
    assert cuda_graph_sizes(perf, max_batch=4096, max_num_tokens=2048,
                            tokens_per_request=4)[-1] == 512


def test_a_decode_batch_rounds_up_to_the_next_kept_graph():
    kept = (1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 1024, 2048, 2304)
    assert cuda_graph_batch(2062, kept) == 2304
    assert cuda_graph_batch(2048, kept) == 2048
    assert cuda_graph_batch(300, kept) == 384
    assert cuda_graph_batch(2305, kept) == 2305  # no graph holds it: eager, not padded
    assert cuda_graph_batch(7, ()) == 7  # an engine that pads nothing


def test_decode_only_iterations_are_priced_at_the_padded_graph(host, captured):
    from attrs import evolve

    from zrt_core.estimate.engine import ENGINES

    # 1.6 GiB of toy GPU: the KV cache holds a number of 32/32 sequences that is no graph
    # size, so TensorRT-LLM's decode-only iterations pad it up to the next one
    infer = InferSpec(input_len=32, output_len=32)
    padded = estimate_inference(None, _toy(1.6), Parallel(), infer, host=host,
                                captured=captured)
    plain = estimate_inference(None, _toy(1.6), Parallel(), infer, host=host,
                               captured=captured,
                               engine=evolve(ENGINES["trtllm"], cuda_graph_batch_sizes=()))
    t, u = padded.throughput, plain.throughput
    c = t["concurrency"]
    graph = cuda_graph_batch(c, cuda_graph_sizes(
        ENGINES["trtllm"].cuda_graph_batch_sizes, max_batch=t["engine_max_batch"],
        max_num_tokens=t["engine_max_num_tokens"]))
    assert graph > c and t["decode_graph_batch"] == graph and u["decode_graph_batch"] == c
    # the padded rows cost their GEMM and elementwise work; mixed iterations run eagerly
    assert t["decode_iteration_ms"] > u["decode_iteration_ms"]
    assert t["mixed_iteration_ms"] == pytest.approx(u["mixed_iteration_ms"], rel=1e-12)
    n = t["mixed_iterations_per_period"]
    assert t["period_ms"] == pytest.approx(
        n * t["mixed_iteration_ms"] + (32 - n) * t["decode_iteration_ms"], rel=1e-9)
    assert any(f"CUDA graph for {graph:,} sequences" in note for note in padded.notes)


@pytest.mark.needs("zrt-nvidia")  # prices on the H100 pack
def test_fused_attention_writes_only_the_new_rows_of_a_sliding_cache():
    from zrt_core.capture.api import capture
    from zrt_core.estimate.inference import _Estimator
    from zrt_core.ir.graph import Phase
    from zrt_core.strategy import check_layout

    # transformers' sliding-window cache keeps a slice of cat(cache, new) as the next
    # step's cache, so the concatenation leaves the fused FlashAttention region; a paged
    # engine writes only the new token's K and V rows
    full = get_plugin_manager()  # the CUDA fusion pack
    cfg = dict(LLAMA, model_type="mistral", sliding_window=64, head_dim=32)
    cap = CapturedModel.from_capture(capture(cfg, phases=("prefill", "decode"), batch=1,
                                             seq_len=32, host=full))
    est = _Estimator(cap, full.hardware_spec("nvidia_h100_sxm"), check_layout(Parallel(),
                     cap.dims), InferSpec(input_len=32, output_len=32), full, "trtllm")
    attn = [n for n in est.graph(Phase.DECODE, 4, 40).nodes
            if n.category == Category.ATTENTION]
    assert attn and all(n.fused_from and n.attrs.get("paged") for n in attn)
    # written: the output 4 x 1 x 4 heads x 32 x 2 B = 1024, its log-sum-exp 4 x 4 x 1 x
    # 4 B = 64, and one new row of K and of V: 2 x (4 x 2 heads x 1 x 32 x 2 B) = 1024 —
    # not the 41-row concatenations (2 x 20992 B) the graph returns
    assert [n.bytes_written for n in attn] == [2112]  # one node per layer template


def test_trtllm_bench_settings_follow_its_heuristic():
    # 8e9 params at 1 byte, 80 GiB device: (80 - 7.45) x 0.9 = 65.3 GiB of cache; 64 KiB per
    # token x 256 tokens = 16 MiB per request -> 4179 requests -> capped at 4096 -> 4096;
    # tokens 4096 x (1 + 128/128) = 8192 -> 8192
    s = trtllm_bench_settings(total_params=8_000_000_000, weight_bytes_per_param=1.0,
                              kv_bytes_per_token_model=65536, device_gib=80, gpus=1, pp=1,
                              input_len=128, output_len=128, kv_fraction=0.9)
    assert (s.max_batch, s.max_num_tokens) == (4096, 8192)
    # a small request count rounds up to 64 sequences and 2048 tokens at least
    s = trtllm_bench_settings(total_params=70_000_000_000, weight_bytes_per_param=1.0,
                              kv_bytes_per_token_model=163840, device_gib=80, gpus=1, pp=1,
                              input_len=20000, output_len=2000, kv_fraction=0.9)
    assert (s.max_batch, s.max_num_tokens) == (64, 2048)
    # without chunked prefill (trtllm-bench's default) the budget holds the longest prompt
    # plus the max batch: max(2048, 20000 + 64) = 20064
    s = trtllm_bench_settings(total_params=70_000_000_000, weight_bytes_per_param=1.0,
                              kv_bytes_per_token_model=163840, device_gib=80, gpus=1, pp=1,
                              input_len=20000, output_len=2000, kv_fraction=0.9,
                              chunked_prefill=False)
    assert (s.max_batch, s.max_num_tokens) == (64, 20064)
    # and a budget already above it stays: max(8192, 128 + 4096) = 8192
    s = trtllm_bench_settings(total_params=8_000_000_000, weight_bytes_per_param=1.0,
                              kv_bytes_per_token_model=65536, device_gib=80, gpus=1, pp=1,
                              input_len=128, output_len=128, kv_fraction=0.9,
                              chunked_prefill=False)
    assert (s.max_batch, s.max_num_tokens) == (4096, 8192)



def test_vllm_batch_defaults_follow_the_device_and_the_entry_point():
    # vLLM V1 EngineArgs.get_batch_defaults: 70 GiB or more and not an A100 -> 1024
    # sequences, 16384 tokens offline (LLM class) and 8192 served; else 256 and 8192 / 2048
    vllm = engine_profile("vllm")

    def settings(device_gib: float, device: str, online: bool) -> tuple[int, int]:
        s = vllm.settings(total_params=1, weight_bytes_per_param=1,
                          kv_bytes_per_token_model=1, device_gib=device_gib, tp=1, pp=1,
                          input_len=1, output_len=1, device=device, online=online)
        return s.max_batch, s.max_num_tokens

    assert settings(80, "nvidia_h100_sxm", False) == (1024, 16384)
    assert settings(141, "nvidia_h200", True) == (1024, 8192)
    assert settings(80, "nvidia_a100_sxm_80g", False) == (256, 8192)
    assert settings(48, "l40s", True) == (256, 2048)


def test_attention_dp_sizes_trtllm_bench_over_the_expert_group():
    from zrt_core.estimate.engine import bench_group_size

    # TP 8 (experts TP-split, ep 1 x etp 8 = 8) and TP 8 + EP 8 inside it (8 x 1): --tp 8
    assert bench_group_size(8, 1, 8) == 8
    assert bench_group_size(8, 8, 1) == 8
    # attention DP: tp 1, dp 8, ep 8 -> the experts span the 8 replicas: --tp 8, whose
    # heuristic each replica then runs with
    assert bench_group_size(1, 8, 1) == 8
    # a dense model's replicas stay apart: tp 2 (ep 1 x etp 2) -> --tp 2
    assert bench_group_size(2, 1, 2) == 2
    # 70e9 params at 1 byte = 65.19 GiB, 16 MiB per 256-token request: sized for one GPU
    # of 80 GiB, (80 - 65.19) x 0.9 = 13.33 GiB -> 852.9 requests -> 128 x 7 = 896, tokens
    # 1706 -> 2048; over the attention-DP group of 8, (640 - 65.19) x 0.9 = 517.3 GiB ->
    # 33,109 -> capped at 4096, tokens 8192 (each rank's limits)
    kwargs = dict(total_params=70_000_000_000, weight_bytes_per_param=1.0,
                  kv_bytes_per_token_model=65536, device_gib=80, pp=1, input_len=128,
                  output_len=128, kv_fraction=0.9)
    s = trtllm_bench_settings(gpus=1, **kwargs)
    assert (s.max_batch, s.max_num_tokens) == (896, 2048)
    s = trtllm_bench_settings(gpus=bench_group_size(1, 8, 1), **kwargs)
    assert (s.max_batch, s.max_num_tokens) == (4096, 8192)


def test_trtllm_bench_takes_hybrid_models_extra_cache_as_it_does():
    # 8e9 params x 2 bytes = 14.90 GiB; (80 - 14.90) x 0.9² = 52.73 GiB of cache for a
    # hybrid; a request holds 16 KiB x 2048 tokens + 50 MiB of Mamba state = 82 MiB:
    # 658.48 requests -> 2 x floor(658.48 / 2) = 658 (no optimistic rounding);
    # tokens 658.48 x 2 = 1317 -> 2048
    kwargs = dict(total_params=8_000_000_000, weight_bytes_per_param=2.0,
                  kv_bytes_per_token_model=16384, extra_bytes_per_request_model=50 * 2**20,
                  device_gib=80, gpus=1, pp=1, input_len=1024, output_len=1024,
                  kv_fraction=0.9)
    s = trtllm_bench_settings(hybrid=True, **kwargs)
    assert (s.max_batch, s.max_num_tokens) == (658, 2048)
    # not a hybrid: (80 - 14.90) x 0.9 / 82 MiB = 731.6 -> 128 x ceil(731.6 / 128) = 768
    s = trtllm_bench_settings(**kwargs)
    assert (s.max_batch, s.max_num_tokens) == (768, 2048)


def test_trtllm_bench_inputs_come_from_the_graphs_caches(host, captured):
    from zrt_core.estimate.inference import _Estimator
    from zrt_core.strategy import check_layout

    infer = InferSpec(input_len=32, output_len=32)
    for tp, per_token in ((1, 512), (2, 512), (4, 1024)):
        est = _Estimator(captured, _toy(), check_layout(Parallel(tp=tp), captured.dims),
                         infer, host, "trtllm")
        # 2 layers x (K and V) x max(tp, 2 KV heads) x 32 x 2 bytes: at tp 4 each rank
        # holds one of the 2 KV heads, replicated, and trtllm-bench counts every rank's
        assert est._kv_bytes_model() == (per_token, 0, False)


def test_a_model_that_does_not_fit_is_reported_not_raised(host, captured):
    infer = InferSpec(input_len=32, output_len=32, batch=2)
    r = estimate_inference(None, _toy(0.0005), Parallel(), infer, host=host,
                           captured=captured)
    assert not r.fits and r.max_batch == 0
    assert "exceed" in r.memory.message and "GiB" in r.memory.message
    assert r.ttft_s > 0 and r.tpot_s > 0  # the times are still predicted
    mt = estimate_inference(None, _toy(0.0005), Parallel(), InferSpec(input_len=32,
                                                                      output_len=32),
                            host=host, captured=captured)
    assert mt.output_tokens_per_s == 0.0 and not mt.fits


def test_captured_model_round_trips_through_json(captured):
    again = CapturedModel.from_json(captured.to_json())
    assert again.graph("decode").to_json() == captured.graph("decode").to_json()
    assert (again.total_params, again.seq_len) == (captured.total_params, 32)
    assert again.total_params == 426_624


def test_max_throughput_says_why_ttft_equals_tpot(host, captured):
    # 32-token prompts, 16 output tokens on 4 GiB: the engine's 4096 sequences each finish
    # a prompt every 16 iterations, 4096 x 32 / 16 = 8192 prompt tokens per iteration, so
    # every steady-state iteration is a mixed one (n_mixed = output_len = 16) and a prompt
    # fits in one: TTFT = one mixed iteration = TPOT, and the report says so
    infer = InferSpec(input_len=32, output_len=16)
    r = estimate_inference(None, _toy(4.0), Parallel(), infer, host=host, captured=captured)
    t = r.throughput
    assert r.batch == 4096
    assert (t["mixed_iterations_per_period"], t["prompt_tokens_per_mixed_iteration"]) == (
        16, 8192)
    assert r.ttft_s == r.tpot_s == pytest.approx(t["mixed_iteration_ms"] / 1e3, rel=1e-12)
    assert any(n.startswith("TTFT equals TPOT: in the steady state every iteration mixes")
               for n in r.notes)
    # a static batch has a prefill step of its own: no such note
    latency = estimate_inference(None, _toy(4.0), Parallel(), InferSpec(
        input_len=32, output_len=16, batch=2), host=host, captured=captured)
    assert latency.ttft_s != latency.tpot_s
    assert not any(n.startswith("TTFT equals TPOT") for n in latency.notes)


def test_num_requests_replays_the_finite_set(host, captured):
    engine = _toy_engine()
    steady = estimate_inference(None, _toy(), Parallel(), InferSpec(input_len=32, output_len=3),
                                host=host, captured=captured, engine=engine)
    r = estimate_inference(None, _toy(), Parallel(),
                           InferSpec(input_len=32, output_len=3, num_requests=2),
                           host=host, captured=captured, engine=engine)
    t = r.throughput
    # 60 tokens an iteration hold one 32-token prompt: it 0 admits 1; it 1 decodes it and
    # admits the 2nd ((60 - 1) // 32 = 1); it 2 decodes both; it 3 the 2nd alone
    assert (t["iterations"], t["prompt_iterations"], t["peak_running"]) == (4, 2, 2)
    assert r.output_tokens_per_s == pytest.approx(2 * 3 / t["benchmark_s"], rel=1e-12)
    assert t["steady_state_output_tokens_per_s"] == pytest.approx(steady.output_tokens_per_s,
                                                                  rel=1e-12)
    # two requests never fill the 3 steady slots: the set is slower than the steady state
    assert r.output_tokens_per_s < steady.output_tokens_per_s
    assert r.workload["num_requests"] == 2 and "num_requests" not in steady.workload
    # vLLM's chunked prefill is not replayed: the steady state, and a note that says so
    vllm = estimate_inference(None, _toy(), Parallel(),
                              InferSpec(input_len=32, output_len=3, num_requests=2),
                              host=host, captured=captured, engine="vllm")
    assert any("not replayed" in n for n in vllm.notes)
    assert "benchmark_s" not in vllm.throughput


def test_the_executors_host_work_bounds_an_iteration(host, captured):
    # With 1 ms of host work a scheduled request (the toy GPU's own steps take well under
    # a millisecond), every iteration is host-bound: a decode iteration of C requests takes
    # C ms, a mixed one C + its admitted prompts ms, and a note says so. Without the field
    # (0: not modelled) the GPU's steps stand.
    from attrs import evolve

    infer = InferSpec(input_len=32, output_len=32)
    toy = _toy(1.6)
    slow = evolve(toy, efficiency=evolve(toy.efficiency, serving_host_request_us=1000.0))
    fast = estimate_inference(None, toy, Parallel(), infer, host=host, captured=captured)
    r = estimate_inference(None, slow, Parallel(), infer, host=host, captured=captured)
    t, c = r.throughput, r.batch
    assert t["decode_iteration_ms"] == pytest.approx(c * 1.0, rel=1e-12)
    prompts = t["prompt_tokens_per_mixed_iteration"] / 32
    assert t["mixed_iteration_ms"] == pytest.approx((c + prompts) * 1.0, rel=1e-12)
    assert fast.throughput["decode_iteration_ms"] < c * 1.0
    assert any(n.startswith("host-bound: a decode iteration") or
               n.startswith("host-bound: a mixed iteration") for n in r.notes)
    assert not any(n.startswith("host-bound") for n in fast.notes)
    # latency mode: a static batch of 4 decodes in at least 4 ms
    lat = estimate_inference(None, slow, Parallel(), InferSpec(input_len=32, output_len=16,
                                                               batch=4),
                             host=host, captured=captured)
    assert lat.tpot_s == pytest.approx(4e-3, rel=1e-12)


def test_concurrency_caps_the_in_flight_sequences(host, captured):
    # 32/16 on 4 GiB: offline, 4096 sequences run (test above). 8 closed-loop clients keep
    # 8 in flight: the same steady state at c = 8 (8 x 32 / 16 = 16 prompt tokens a step,
    # one mixed iteration per period, 16 iterations: 1 mixed + 15 decode)
    infer = InferSpec(input_len=32, output_len=16, concurrency=8)
    r = estimate_inference(None, _toy(4.0), Parallel(), infer, host=host, captured=captured)
    t = r.throughput
    assert (r.mode, r.batch, t["concurrency"], t["clients"]) == ("concurrency", 8, 8, 8)
    assert t["queue_wait_ms"] == 0.0
    period = t["mixed_iteration_ms"] * t["mixed_iterations_per_period"] + t[
        "decode_iteration_ms"] * (16 - t["mixed_iterations_per_period"])
    assert t["period_ms"] == pytest.approx(period, rel=1e-12)
    assert r.output_tokens_per_s == pytest.approx(8 * 16 / (period / 1e3), rel=1e-9)
    assert r.workload["concurrency"] == 8


def test_clients_beyond_the_engine_queue_for_a_slot(host, captured):
    # the toy engine holds 4 sequences; 12 clients: the steady state of the offline run
    # (3 busy slots: test_admission_limited_steady_state_identity), each request first
    # waiting 12 / 3 - 1 = 3 periods for a slot (Little's law), added to its TTFT
    engine = _toy_engine()
    offline = estimate_inference(None, _toy(), Parallel(), InferSpec(input_len=32,
                                 output_len=3), host=host, captured=captured, engine=engine)
    r = estimate_inference(None, _toy(), Parallel(),
                           InferSpec(input_len=32, output_len=3, concurrency=12),
                           host=host, captured=captured, engine=engine)
    t = r.throughput
    assert t["concurrency"] == offline.throughput["concurrency"] == 3
    assert r.output_tokens_per_s == pytest.approx(offline.output_tokens_per_s, rel=1e-12)
    assert t["queue_wait_ms"] == pytest.approx(3 * t["period_ms"], rel=1e-12)
    assert r.ttft_s == pytest.approx(offline.ttft_s + 3 * t["period_ms"] / 1e3, rel=1e-12)
    assert any(n.startswith("concurrency 12: 12 requests a replica, but the engine runs "
                            "at most 4 at once") for n in r.notes)


def test_batch_and_concurrency_are_not_both_given():
    from zrt_core.errors import SpecError

    with pytest.raises(SpecError, match="batch 4 and concurrency 8 both given"):
        InferSpec(input_len=32, output_len=16, batch=4, concurrency=8)


def test_sglang_sizes_its_prefill_chunk_by_the_gpu_memory():
    # server_args.py: chunked_prefill_size 8192 below 160 GB (H100, H200), 16384 from it
    sglang = engine_profile("sglang")
    kw = dict(total_params=8_000_000_000, weight_bytes_per_param=1.0,
              kv_bytes_per_token_model=131072.0, tp=1, pp=1, input_len=1000, output_len=1000)
    assert sglang.settings(device_gib=141.0, **kw).max_num_tokens == 8192
    assert sglang.settings(device_gib=180.0, **kw).max_num_tokens == 16384
    assert sglang.settings(device_gib=180.0, **kw).max_batch == 4096
    assert sglang.chunked_prefill and sglang.memory_of_device


def test_fewer_clients_than_pipeline_stages_pass_the_stages_as_a_batch(host, captured):
    # one client, two stages: no micro-batch for the second stage; the request is priced as
    # the static batch of one it is (prefill, then decode steps through both stages)
    one = InferSpec(input_len=32, output_len=16, concurrency=1)
    r = estimate_inference(None, _toy(4.0), Parallel(pp=2), one, host=host, captured=captured)
    batch = estimate_inference(None, _toy(4.0), Parallel(pp=2),
                               InferSpec(input_len=32, output_len=16, batch=1), host=host,
                               captured=captured)
    assert r.mode == "concurrency" and r.batch == 1
    assert (r.ttft_s, r.tpot_s, r.output_tokens_per_s) == (
        batch.ttft_s, batch.tpot_s, batch.output_tokens_per_s)
    assert any("cannot fill its 2 pipeline stages" in n for n in r.notes)


MOE = dict(model_type="qwen3_moe", hidden_size=128, intermediate_size=256,
           moe_intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, head_dim=32, num_experts=4, num_experts_per_tok=2,
           vocab_size=512, decoder_sparse_step=1, mlp_only_layers=[])


def test_attention_dp_iterations_wait_for_the_slowest_rank(host):
    from zrt_core.capture.api import capture

    if "moe" not in _CACHE:
        _CACHE["moe"] = CapturedModel.from_capture(capture(
            MOE, phases=("prefill", "decode"), batch=1, seq_len=32, host=host))
    cap = _CACHE["moe"]
    # 64 clients a rank: one iteration in ~190 carries a prompt batch on a given rank
    infer = InferSpec(input_len=32, output_len=64, concurrency=256)
    adp = estimate_inference(None, _toy(4.0), Parallel(tp=1, dp=4, ep=4), infer, host=host,
                             captured=cap)
    t = adp.throughput
    a = t["attention_dp"]
    # a rank carries a prompt in p = n_mixed / osl of its iterations, some rank in
    # q = 1 - (1 - p)^4 of them; the non-expert part of the mixed iteration's extra time
    # is paid q of the time, the routed experts' part p of it
    p = t["mixed_iterations_per_period"] / 64
    assert a["rank_mixed_fraction"] == pytest.approx(p, rel=1e-12)
    assert a["any_rank_mixed_fraction"] == pytest.approx(1 - (1 - p) ** 4, rel=1e-12)
    assert a["delta_attention_ms"] + a["delta_experts_ms"] == pytest.approx(
        t["mixed_iteration_ms"] - t["decode_iteration_ms"], rel=1e-9)
    assert 0 < a["delta_experts_ms"] < a["delta_attention_ms"] + a["delta_experts_ms"]
    iteration = (t["decode_iteration_ms"] + a["any_rank_mixed_fraction"]
                 * a["delta_attention_ms"] + p * a["delta_experts_ms"])
    assert a["iteration_ms"] == pytest.approx(iteration, rel=1e-12)
    assert t["period_ms"] == pytest.approx(64 * iteration, rel=1e-12)
    # slower than the steady state that pays each rank's own prompts only
    assert t["period_ms"] > (t["mixed_iterations_per_period"] * t["mixed_iteration_ms"]
                             + (64 - t["mixed_iterations_per_period"])
                             * t["decode_iteration_ms"])
    assert any(n.startswith("attention DP over 4 ranks") for n in adp.notes)
    # experts inside the TP group (no attention DP): the steady state as before
    tp = estimate_inference(None, _toy(4.0), Parallel(tp=4, ep=4), infer, host=host,
                            captured=cap)
    assert "attention_dp" not in tp.throughput


def test_clients_that_do_not_divide_over_the_stages_all_run(host, captured):
    # 3 clients, 2 stages: micro-batches of 2 and 1, priced at the larger (the pipeline's
    # pace); all 3 run (none queues), so throughput = 3 x 16 / period
    r = estimate_inference(None, _toy(4.0), Parallel(pp=2),
                           InferSpec(input_len=32, output_len=16, concurrency=3), host=host,
                           captured=captured)
    t = r.throughput
    assert (r.batch, t["concurrency"], t["queue_wait_ms"]) == (3, 3, 0.0)
    assert r.output_tokens_per_s == pytest.approx(3 * 16 / (t["period_ms"] / 1e3), rel=1e-9)
