"""Issue 16: each framework's reader on real argument sets from public recipes and
documentation (cited beside each), its writer read back, and bad input as one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zrt_core.errors import SpecError, UnknownNameError
from zrt_core.frameworks import Header, emit, read, read_text, request_from_values
from zrt_core.modelinfo import ModelDims

LLAMA3_8B = ModelDims.from_config({
    "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
    "vocab_size": 128256})
MIXTRAL = ModelDims.from_config({
    "model_type": "mixtral", "hidden_size": 4096, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
    "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2})

# NVIDIA/Megatron-LM@d98e8a6 examples/llama/train_llama3_8b_h100_fp8.sh: DISTRIBUTED_ARGS,
# MODEL_ARGS, TRAINING_ARGS (the optimiser's and the data's left out), DTYPE_ARGS for fp8,
# MODEL_PARALLEL_ARGS and DDP_ARGS, with the script's values substituted
MEGATRON_LLAMA3_8B_FP8 = """
torchrun --nproc_per_node 8 --nnodes 1 --node_rank 0 --master_addr localhost \\
  --master_port 29500 pretrain_gpt.py \\
  --use-mcore-models --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 \\
  --num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128 \\
  --seq-length 8192 --max-position-embeddings 8192 --position-embedding-type rope \\
  --swiglu --normalization RMSNorm \\
  --micro-batch-size 1 --global-batch-size 128 --lr 0.00015 --bf16 \\
  --cross-entropy-loss-fusion \\
  --fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo max \\
  --fp8-param-gather \\
  --tensor-model-parallel-size 1 --context-parallel-size 1 --sequence-parallel \\
  --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
"""

# NVIDIA/Megatron-LM@d98e8a6 examples/mixtral/train_mixtral_8x7b_distributed.sh on 4 nodes
# (NNODES=${SLURM_NNODES}): MODEL_ARGS' sizes, MOE_ARGS, TRAINING_ARGS' batch and dtype,
# MODEL_PARALLEL_ARGS
MEGATRON_MIXTRAL = """
torchrun --nproc_per_node 8 --nnodes 4 pretrain_gpt.py \\
  --seq-length 4096 --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 \\
  --num-attention-heads 32 --group-query-attention --num-query-groups 8 \\
  --num-experts 8 --moe-router-topk 2 --moe-router-load-balancing-type aux_loss \\
  --moe-aux-loss-coeff 1e-2 --moe-grouped-gemm --moe-token-dispatcher-type alltoall \\
  --overlap-param-gather --overlap-grad-reduce \\
  --micro-batch-size 1 --global-batch-size 256 --lr 1e-4 --bf16 \\
  --tensor-model-parallel-size 1 --pipeline-model-parallel-size 4 \\
  --expert-model-parallel-size 8 --use-distributed-optimizer --sequence-parallel
"""


def test_megatron_llama3_8b_fp8_example() -> None:
    got = read("megatron", MEGATRON_LLAMA3_8B_FP8, {"dims": LLAMA3_8B, "layers": 32})
    v = got.values
    # 8 GPUs (--nproc_per_node 8 × --nnodes 1) over tp 1 × pp 1 × cp 1: dp = 8
    assert (v["num_gpus"], v["tp"], v.get("pp", 1), v["cp"]) == (8, 1, 1, 1)
    assert (v["micro_batch"], v["global_batch"], v["seq_len"]) == (1, 128, 8192)
    # --fp8-format hybrid with TransformerConfig.fp8_recipe's default "delayed"
    assert v["precision"] == "fp8"
    assert (v["zero"], v["fsdp"], v["sp"], v["recompute"]) == (1, False, True, "none")
    request = request_from_values(v)
    assert request.parallel.dp == 8
    # with tp = 1 there is nothing to split along the sequence: resolved off
    assert request.parallel.sequence_parallel(training=True) is False
    for arg in ("--lr 0.00015", "--fp8-amax-history-len 1024", "--overlap-grad-reduce",
                "--kv-channels 128", "--swiglu"):
        assert f"{arg} (not modelled)" in got.ignored
    # --fp8-param-gather: the fp8 weights alone, no bf16 copy (the weights' memory)
    assert (v["quantized_params"], v["grad_reduce_in_fp32"]) == (True, True)
    assert "--node_rank 0 (launcher)" in got.ignored


def test_megatron_mixtral_example_and_its_round_trip() -> None:
    got = read("megatron", MEGATRON_MIXTRAL, {"dims": MIXTRAL, "layers": 32})
    request = request_from_values(got.values)
    p = request.parallel
    # 32 GPUs over tp 1 × pp 4: dp 8; EP 8 (experts not tensor-parallel: etp follows tp 1)
    assert (p.tp, p.pp, p.dp, p.ep, p.expert_tp) == (1, 4, 8, 8, 1)
    assert request.train.global_batch == 256 and request.train.precision == "bf16"
    assert p.ep_dispatcher == "alltoall"  # --moe-token-dispatcher-type alltoall
    text = emit("megatron", request, Header(model="mixtral", hardware="nvidia_h100_sxm",
                                            predicted={"step_time_s": 1.5}, experts=8))
    assert "# predicted: step_time_s 1.5" in text
    back = request_from_values(read_text("megatron", text, {"layers": 32}).values)
    assert back.normalized() == request.normalized()


def test_megatron_model_size_that_contradicts_the_model_is_one_line() -> None:
    args = MEGATRON_LLAMA3_8B_FP8.replace("--num-layers 32", "--num-layers 80")
    with pytest.raises(SpecError, match=r"--num-layers 80 but the model has 32 \(layers\)"):
        read("megatron", args, {"dims": LLAMA3_8B})


def test_megatron_virtual_stages_from_layers_per_virtual_stage() -> None:
    # --num-layers-per-virtual-pipeline-stage 2 with 32 layers on pp 4: 32 / (4 × 2) = 4
    got = read("megatron", "--pipeline-model-parallel-size 4 "
               "--num-layers-per-virtual-pipeline-stage 2 --micro-batch-size 1", {"layers": 32})
    assert got.values["vp"] == 4
    with pytest.raises(SpecError, match="needs the layer count"):
        read("megatron", "--pipeline-model-parallel-size 4 "
             "--num-layers-per-virtual-pipeline-stage 2", {})


@pytest.mark.parametrize("args, message", [
    ("--bf16 --fp16", "--bf16 and --fp16 are both given"),
    ("--tensor-model-parallel-size four", "--tensor-model-parallel-size must be an integer, "
                                          "got 'four'"),
    ("--recompute-activations --recompute-granularity full", "disagree"),
    ("--fp8-format e5m2", "--fp8-format 'e5m2' is not one zrt models"),
    ("--tensor-model-parallel-size 2 --tensor-model-parallel-size 4", "given twice"),
    ("--account-for-embedding-in-pipeline-split", "without the other"),
    ("--optimizer lion", "--optimizer 'lion' is not one zrt models"),
])
def test_megatron_bad_arguments_name_the_argument(args: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        read("megatron", args, {})


# NVIDIA-NeMo/Megatron-Bridge@067f987d scripts/performance/README.md, the DeepSeek-V3 GB300
# launch (account, container, log and token flags left out) — the layout is the recipe's
BRIDGE_README = ("uv run python scripts/performance/setup_experiment.py -m deepseek "
                 "-mr deepseek_v3 --num_gpus 256 --gpus_per_node 4 -t 00:15:00 -g gb300 \\ \n"
                 "  -c fp8_mx")
# ... and with the layout of the performance summary row the validation record
# mbridge-26.08-pre-training-deepseek-v3-gb300-256gpu-mxfp8-gbs4096 holds
# (TP 1, PP 2, VP 8, EP 32, GBS 4096)
BRIDGE_DSV3 = BRIDGE_README + " -tp 1 -pp 2 -cp 1 -vp 8 -ep 32 -mb 1 -gb 4096 -sl 4096"


def test_bridge_launch_without_the_layout_is_refused() -> None:
    with pytest.raises(SpecError, match="the layout would be the recipe's own"):
        read("bridge", BRIDGE_README, {})


def test_bridge_perf_launch_gives_the_records_layout() -> None:
    from zrt_core.validate import load_records, suite_path, training_case

    got = read("bridge", BRIDGE_DSV3, {"hardware": "nvidia_gb300_nvl72"})
    request = request_from_values(got.values)
    (record,) = [r for r in load_records(suite_path("public")) if r.id ==
                 "mbridge-26.08-pre-training-deepseek-v3-gb300-256gpu-mxfp8-gbs4096"]
    case = training_case(record)
    # 256 GPUs / (tp 1 × pp 2 × cp 1) = dp 128; EP 32; mxfp8 (-c fp8_mx); the perf recipes'
    # distributed optimizer and sequence parallelism with tp > 1
    assert request.normalized() == request_from_values({
        "tp": 1, "pp": 2, "vp": 8, "ep": 32, "etp": case.parallel.etp, "dp": 128,
        "micro_batch": 1, "global_batch": 4096, "seq_len": case.train.seq_len,
        "precision": "mxfp8", "zero": 1}).normalized()
    # the launch names no dispatcher: the recipe's own (flex + HybridEP at 26.08, which the
    # record's case reads from zrt_core.recipes) is not known to a launch line
    assert case.parallel.ep_dispatcher == "hybridep"
    assert request.parallel.to_json() == {**case.parallel.to_json(), "sp": None,
                                          "ep_dispatcher": "alltoall"}
    assert any("--moe_flex_dispatcher_backend" in n for n in got.notes)
    assert "-t 00:15:00 (not modelled)" in got.ignored
    with pytest.raises(SpecError, match="--gpu gb300 is nvidia_gb300_nvl72, but zrt was asked"):
        read("bridge", BRIDGE_DSV3, {"hardware": "nvidia_b200"})


@pytest.mark.parametrize("args, message", [
    ("-tp 2 -pp 1 -gb 8 -c fp8", "--compute_dtype 'fp8' is not one zrt models"),
    ("-tp 2 -pp 1 -gb 8 -rl 1 --recompute_modules core_attn", "are both given"),
    ("-tp x -pp 1 -gb 8", "--tensor_model_parallel_size must be an integer"),
    ("-tp 2 -pp 1 -gb 8 model.account_for_loss_in_pipeline_split=true", "differ"),
    ("-tp 2 -pp 1 -gb 8 model.sequence_parallel=maybe", "must be true or false"),
])
def test_bridge_bad_arguments_name_the_argument(args: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        read("bridge", args, {})


# pytorch/torchtitan@038d5fd torchtitan/models/llama3/train_configs/llama3_70b.toml (the
# sections zrt reads and two it ignores; "a preset for 64 A100 GPUs")
TORCHTITAN_70B = """
[model]
name = "llama3"
flavor = "70B"
[optimizer]
name = "AdamW"
lr = 1.5e-4
[training]
local_batch_size = 8
seq_len = 8192
max_norm = 1.0
[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
tensor_parallel_degree = 8
pipeline_parallel_degree = 1
context_parallel_degree = 1
[activation_checkpoint]
mode = "full"
[float8]
enable_fsdp_float8_all_gather = false
"""


def test_torchtitan_llama3_70b_preset(tmp_path: Path) -> None:
    path = tmp_path / "llama3_70b.toml"
    path.write_text(TORCHTITAN_70B)
    got = read("torchtitan", str(path), {"num_gpus": 64, "layers": 80})
    request = request_from_values(got.values)
    p, t = request.parallel, request.train
    # shard degree -1: 64 / (tp 8 × pp 1 × cp 1 × replicate 1) = 8, FSDP over them
    assert (p.tp, p.dp, t.zero, t.fsdp) == (8, 8, 3, True)
    # global batch -1: local 8 × dp 8 = 64
    assert (t.micro_batch, t.global_batch, t.seq_len, t.recompute) == (8, 64, 8192, "full")
    assert t.precision == "bf16" and p.sequence_parallel(training=True)
    assert "[optimizer] lr (not modelled)" in got.ignored
    assert "[float8] enable_fsdp_float8_all_gather (not modelled)" in got.ignored
    text = emit("torchtitan", request, Header(model="llama3-70b", hardware="nvidia_a100_sxm_80g",
                                              layers=80))
    back = request_from_values(read_text("torchtitan", text, {"layers": 80}).values)
    assert back.normalized() == request.normalized()
    with pytest.raises(SpecError, match="world size is not known"):
        read("torchtitan", str(path), {})


def test_torchtitan_pipeline_micro_batches_and_interleaving() -> None:
    # job_config.py: a rank's local batch is cut into pipeline micro-batches of
    # pipeline_parallel_microbatch_size; pipeline_parallel_layers_per_stage sets the stages
    got = read_text("torchtitan", """
[training]
local_batch_size = 32
seq_len = 4096
[parallelism]
data_parallel_shard_degree = 2
pipeline_parallel_degree = 4
pipeline_parallel_microbatch_size = 2
pipeline_parallel_schedule = "Interleaved1F1B"
pipeline_parallel_layers_per_stage = 4
[activation_checkpoint]
mode = "none"
""", {"layers": 32})
    request = request_from_values(got.values)
    p, t = request.parallel, request.train
    # 32 layers / (4 layers per stage × pp 4) = vp 2; global 32 × dp 2 = 64 in micro-batches
    # of 2: 16 per pipeline
    assert (p.pp, p.vp, p.dp, t.micro_batch, t.global_batch) == (4, 2, 2, 2, 64)
    assert (t.pp_schedule, t.num_microbatches(p)) == ("interleaved", 16)
    text = emit("torchtitan", request, Header(model="m", hardware="nvidia_h100_sxm", layers=32))
    back = request_from_values(read_text("torchtitan", text, {"layers": 32}).values)
    assert back.normalized() == request.normalized()


# DeepSpeed configs as the HuggingFace Trainer integration writes them ("auto" filled in by
# the Trainer): khang119966/Vintern-1B-v3.5-Demo projects/llava_sam2/deepspeed_zero2_sam2.json
DS_ZERO2_AUTO = {
    "gradient_accumulation_steps": "auto", "train_micro_batch_size_per_gpu": "auto",
    "gradient_clipping": "auto", "zero_allow_untested_optimizer": True,
    "zero_optimization": {"stage": 2, "overlap_comm": True, "reduce_scatter": True,
                          "contiguous_gradients": True},
    "fp16": {"enabled": False, "initial_scale_power": 16}, "bf16": {"enabled": True}}
# ... and explicit sizes: ZeRO-2 with the optimizer offloaded (DeepSpeed's config-json page:
# train_batch_size = micro × accumulation × ranks)
DS_EXPLICIT = {"train_batch_size": 256, "train_micro_batch_size_per_gpu": 4,
               "gradient_accumulation_steps": 8,
               "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu",
                                                                       "pin_memory": True}},
               "bf16": {"enabled": True},
               "optimizer": {"type": "AdamW", "params": {"lr": 3e-5}}}


def test_deepspeed_configs(tmp_path: Path) -> None:
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(DS_ZERO2_AUTO))
    got = read("deepspeed", str(path), {"num_gpus": 8})
    assert (got.values["dp"], got.values["zero"], got.values["precision"]) == (8, 2, "bf16")
    # "auto" sizes stay zrt's flags
    assert "micro_batch" not in got.values and "global_batch" not in got.values
    assert "zero_optimization.overlap_comm (not modelled)" in got.ignored
    assert "gradient_clipping (not modelled)" in got.ignored
    path.write_text(json.dumps(DS_EXPLICIT))
    got = read("deepspeed", str(path), {})
    request = request_from_values(got.values)
    # 256 / (4 × 8) = 8 data-parallel ranks
    assert (request.parallel.dp, request.train.micro_batch, request.train.global_batch) == \
        (8, 4, 256)
    assert request.train.offload_optimizer and request.train.zero == 2
    text = emit("deepspeed", request, Header(model="m", hardware="nvidia_h100_sxm"))
    back = request_from_values(read_text("deepspeed", text, {}).values)
    assert back.normalized() == request.normalized()
    with pytest.raises(SpecError, match="the batch sizes give 8 data-parallel ranks, but "
                                        "--num-gpus is 16"):
        read("deepspeed", str(path), {"num_gpus": 16})


# NVIDIA TensorRT-LLM 1.4.0rc1 documentation, _downloads/.../qwen3.5-gb300-agentic-decode.yaml
# (the keys zrt reads and some it does not)
TRTLLM_QWEN35 = """
cuda_graph_config:
  enable_padding: true
  batch_sizes: [1, 2, 4, 8]
enable_attention_dp: false
kv_cache_config:
  dtype: fp8
  enable_block_reuse: false
  free_gpu_memory_fraction: 0.85
max_seq_len: 262148
speculative_config:
  decoding_type: MTP
  max_draft_len: 6
pipeline_parallel_size: 1
max_batch_size: 8
max_num_tokens: 56
moe_expert_parallel_size: 2
tensor_parallel_size: 2
"""


def test_trtllm_extra_llm_api_options(tmp_path: Path) -> None:
    path = tmp_path / "qwen3.5-gb300-agentic-decode.yaml"
    path.write_text(TRTLLM_QWEN35)
    got = read("trtllm", str(path), {})
    request = request_from_values({**got.values, "input_len": 1024, "output_len": 1024})
    p, i = request.parallel, request.infer
    # moe_tp = tp / moe_ep = 2 / 2 = 1 (TensorRT-LLM's Mapping)
    assert (p.tp, p.pp, p.ep, p.expert_tp, p.dp) == (2, 1, 2, 1, 1)
    assert (i.batch, i.kv_dtype, i.quant, request.engine) == (8, "fp8", "none", "trtllm")
    # speculative decoding and the CUDA-graph sizes are not modelled: listed, not dropped
    for key in ("speculative_config", "cuda_graph_config", "max_num_tokens", "max_seq_len"):
        assert f"{key} (not modelled)" in got.ignored
    assert "kv_cache_config.free_gpu_memory_fraction (not modelled)" in got.ignored
    text = emit("trtllm", request, Header(model="qwen", hardware="nvidia_gb300_nvl72",
                                          experts=512))
    back = request_from_values({**read_text("trtllm", text).values, "input_len": 1024,
                                "output_len": 1024})
    assert back.normalized() == request.normalized()


# TensorRT-LLM's DeepSeek-R1 best-practice guide (v1.0 era), max-throughput on 8 GPUs:
# trtllm-bench --tp 8 --ep 8 --max_batch_size 384 with this extra_llm_api_options YAML
TRTLLM_ADP = """
cuda_graph_config:
  enable_padding: true
  batch_sizes: [1, 2, 4, 8, 16, 32, 64, 128, 256, 384]
enable_attention_dp: true
tensor_parallel_size: 8
moe_expert_parallel_size: 8
max_batch_size: 384
"""


def test_trtllm_attention_dp_is_data_parallel_attention_over_the_expert_group() -> None:
    got = read_text("trtllm", TRTLLM_ADP)
    request = request_from_values({**got.values, "input_len": 1024, "output_len": 2048})
    p = request.parallel
    # attention on 8 ranks with whole heads (tp 1, dp 8); experts EP 8, moe_tp 8 / 8 = 1
    assert (p.tp, p.dp, p.ep, p.expert_tp) == (1, 8, 8, 1)
    assert request.infer.batch == 384  # per rank
    assert any("enable_attention_dp" in n for n in got.notes)
    assert not any("enable_attention_dp" in n for n in got.ignored)
    text = emit("trtllm", request, Header(model="dsr1", hardware="nvidia_h200", experts=256))
    assert "enable_attention_dp: true" in text and "tensor_parallel_size: 8" in text
    back = request_from_values({**read_text("trtllm", text).values, "input_len": 1024,
                                "output_len": 2048})
    assert back.normalized() == request.normalized()


@pytest.mark.parametrize("text, message", [
    ("tensor_parallel_size: two\n", "tensor_parallel_size must be an integer"),
    ("tensor_parallel_size: 4\nmoe_expert_parallel_size: 3\n", "does not divide"),
    ("tensor_parallel_size: 4\nmoe_expert_parallel_size: 2\nmoe_tensor_parallel_size: 1\n",
     "≠ tensor_parallel_size 4"),
    ("quant_config:\n  quant_algo: INT3\n", "quant_algo 'INT3' is not one zrt models"),
    ("[parallelism]\ntp = 2\n", "not a YAML file|a YAML mapping"),
])
def test_trtllm_bad_values_name_the_key(text: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        read_text("trtllm", text)


# vLLM recipes, DeepSeek-V3/R1 usage guide (docs.vllm.ai/projects/recipes), 8xH200 FP8,
# "Data Parallel + Expert Parallel (DP8+EP)"
VLLM_DSR1 = ("vllm serve deepseek-ai/DeepSeek-R1-0528 --trust-remote-code "
             "--data-parallel-size 8 --enable-expert-parallel")


def test_vllm_dp_ep_recipe() -> None:
    got = read("vllm", VLLM_DSR1)
    request = request_from_values({**got.values, "input_len": 1000, "output_len": 1000})
    p = request.parallel
    # EP over tp × dp = 1 × 8 ranks, each expert whole
    assert (p.tp, p.dp, p.ep, p.expert_tp, request.engine) == (1, 8, 8, 1, "vllm")
    assert "--trust-remote-code (not modelled)" in got.ignored
    assert "model deepseek-ai/DeepSeek-R1-0528: the model is zrt's MODEL" in got.notes
    text = emit("vllm", request, Header(model="deepseek-r1", hardware="nvidia_h200",
                                        experts=256))
    assert "--enable-expert-parallel" in text
    back = request_from_values({**read_text("vllm", text).values, "input_len": 1000,
                                "output_len": 1000})
    assert back.normalized() == request.normalized()
    # without --enable-expert-parallel the experts are split over tp × dp (vLLM's data
    # parallel deployment page)
    dense = read("vllm", "vllm serve m --tensor-parallel-size 2 --data-parallel-size 4")
    assert (dense.values["etp"], dense.values.get("ep", 1)) == (8, 1)


def test_vllm_bad_values() -> None:
    with pytest.raises(SpecError, match="--quantization 'bitsandbytes' is not one zrt models"):
        read("vllm", "vllm serve m --quantization bitsandbytes")
    with pytest.raises(SpecError, match="--max-num-seqs must be an integer"):
        read("vllm", "vllm serve m --max-num-seqs lots")


def test_unknown_framework_and_wrong_file_formats(tmp_path: Path) -> None:
    with pytest.raises(UnknownNameError, match="unknown framework 'nemo2'"):
        read("nemo2", "--tp 2")
    toml = tmp_path / "job.toml"
    toml.write_text(TORCHTITAN_70B)
    with pytest.raises(SpecError, match=r"a DeepSpeed ds_config \.json is expected, got a \.toml"):
        read("deepspeed", str(toml))
    with pytest.raises(SpecError, match=r"a \.toml file is not Megatron-LM arguments"):
        read("megatron", str(toml))
    bad = tmp_path / "broken.toml"
    bad.write_text('{"train_batch_size": 8}')
    with pytest.raises(SpecError, match="not a TOML file"):
        read("torchtitan", str(bad))
    with pytest.raises(SpecError, match="no such file"):
        read("trtllm", str(tmp_path / "missing.yaml"))
    with pytest.raises(SpecError, match="no megatron arguments found"):
        read("megatron", "pretrain_gpt.py")


def test_writers_refuse_what_their_framework_cannot_say() -> None:
    train = request_from_values({"tp": 2, "dp": 2, "micro_batch": 1, "global_batch": 8,
                                 "zero": 1})
    serve = request_from_values({"mode": "infer", "tp": 2})
    header = Header(model="m", hardware="nvidia_h100_sxm")
    with pytest.raises(SpecError, match="holds data parallelism and ZeRO only, not tp=2"):
        emit("deepspeed", train, header)
    with pytest.raises(SpecError, match="ZeRO-1 has no torchtitan key"):
        emit("torchtitan", train, header)
    with pytest.raises(SpecError, match="writes a serving run"):
        emit("trtllm", train, header)
    with pytest.raises(SpecError, match="writes a training run"):
        emit("megatron", serve, header)


@pytest.mark.parametrize("framework", ["megatron", "bridge"])
@pytest.mark.parametrize("split", [
    {"decoder_first_pipeline_num_layers": 3, "decoder_last_pipeline_num_layers": 5},
    {"pipeline_model_parallel_layout": "Et|(tt|)*3,t|tL"},
    {"embedding_loss_stages": True},
])
def test_pipeline_splits_round_trip(framework: str, split: dict) -> None:
    # Megatron's uneven split, its layout string (quoted: | and * are shell characters) and
    # the embedding/loss accounting, as Megatron-LM arguments and as Bridge overrides
    request = request_from_values({"pp": 4, "dp": 2, "tp": 2, "micro_batch": 1,
                                   "global_batch": 64, **split})
    text = emit(framework, request, Header(model="m", hardware="nvidia_h100_sxm"))
    back = request_from_values(read_text(framework, text).values)
    assert back.stage_split == request.stage_split
    assert back.normalized() == request.normalized()


@pytest.mark.parametrize("flags, want", [
    ("", "alltoall"),  # Megatron's default dispatcher
    ("--moe-token-dispatcher-type allgather", "alltoall"),
    ("--moe-token-dispatcher-type flex", "deepep"),  # TransformerConfig's default backend
    ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep", "hybridep"),
])
def test_megatron_dispatcher_flags_and_their_round_trip(flags: str, want: str) -> None:
    base = MEGATRON_MIXTRAL.replace("--moe-token-dispatcher-type alltoall", "")
    got = read("megatron", f"{base} {flags}", {"dims": MIXTRAL, "layers": 32})
    request = request_from_values(got.values)
    assert request.parallel.ep_dispatcher == want
    text = emit("megatron", request, Header(model="mixtral", hardware="nvidia_h100_sxm",
                                            experts=8))
    back = request_from_values(read_text("megatron", text, {"layers": 32}).values)
    assert back.parallel.ep_dispatcher == want


def test_bad_flex_backend_is_one_line() -> None:
    with pytest.raises(SpecError, match="--moe-flex-dispatcher-backend"):
        read("megatron", MEGATRON_MIXTRAL.replace("--moe-token-dispatcher-type alltoall",
                                                  "--moe-token-dispatcher-type flex")
             + " --moe-flex-dispatcher-backend nccl", {"dims": MIXTRAL, "layers": 32})


@pytest.mark.parametrize("framework, text, want", [
    # Megatron-LM's --fp8-recipe tensorwise is TE's Float8CurrentScaling; delayed is the default
    ("megatron", "--tensor-model-parallel-size 1 --micro-batch-size 1 --global-batch-size 8 "
                 "--seq-length 128 --bf16 --fp8-format hybrid --fp8-recipe tensorwise", "fp8_cs"),
    ("megatron", "--tensor-model-parallel-size 1 --micro-batch-size 1 --global-batch-size 8 "
                 "--seq-length 128 --bf16 --fp8-format hybrid", "fp8"),
    # Megatron-Bridge's -c fp8_cs (its perf recipes' FP8) is current scaling too
    ("bridge", "-tp 1 -pp 1 -gb 8 -c fp8_cs", "fp8_cs"),
])
def test_fp8_scaling_recipes_are_read_as_they_run(framework: str, text: str,
                                                  want: str) -> None:
    got = read_text(framework, text, {"layers": 4})
    assert got.values["precision"] == want
    request = request_from_values({**got.values, "num_gpus": 8} if framework == "bridge"
                                  else got.values)
    back = request_from_values(read_text(framework, emit(framework, request, Header(
        model="m", hardware="nvidia_h100_sxm", layers=4)), {"layers": 4}).values)
    assert back.train.precision == want


def test_bridge_has_no_delayed_scaling_to_write() -> None:
    request = request_from_values(read_text("megatron", "--micro-batch-size 1 "
                                            "--global-batch-size 8 --seq-length 128 --bf16 "
                                            "--fp8-format hybrid", {"layers": 4}).values)
    with pytest.raises(SpecError, match=r"no fp8 \(delayed scaling\)"):
        emit("bridge", request, Header(model="m", hardware="nvidia_h100_sxm", layers=4))


def test_bridge_reads_and_writes_a_frozen_language_model() -> None:
    # Megatron-Bridge's Qwen3-VL recipes freeze the language model: the override round-trips
    request = request_from_values({"tp": 1, "pp": 1, "dp": 8, "ep": 8, "micro_batch": 1,
                                   "global_batch": 512, "seq_len": 4096,
                                   "freeze_language_model": True})
    text = emit("bridge", request, Header(model="m", hardware="nvidia_b200"))
    assert "model.freeze_language_model=true" in text
    back = request_from_values(read_text("bridge", text).values)
    assert back.train.freeze_language_model
    assert back.normalized() == request.normalized()
