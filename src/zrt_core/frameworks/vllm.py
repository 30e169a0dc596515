"""vLLM ``vllm serve MODEL --tensor-parallel-size ...`` command lines read into ``zrt run
--infer``'s layout and workload, and written back.

Flags and defaults: vLLM's engine arguments (docs.vllm.ai, "Engine Arguments":
``--tensor-parallel-size``/``-tp`` 1, ``--pipeline-parallel-size``/``-pp`` 1,
``--data-parallel-size``/``-dp`` 1, ``--enable-expert-parallel`` off, ``--max-num-seqs``,
``--quantization``/``-q``, ``--kv-cache-dtype`` auto, ``--dtype`` auto).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from zrt_core.errors import SpecError
from zrt_core.frameworks.base import (
    Header,
    Imported,
    RunRequest,
    as_int,
    choice,
    parse_flags,
    split_argv,
)

ALIASES = {"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size",
           "-dp": "--data-parallel-size", "-q": "--quantization"}
FLAGS = {"--tensor-parallel-size": 1, "--pipeline-parallel-size": 1,
         "--data-parallel-size": 1, "--enable-expert-parallel": 0, "--max-num-seqs": 1,
         "--quantization": 1, "--kv-cache-dtype": 1, "--dtype": 1, "--model": 1}
#: ``--quantization`` → zrt's --quant (AWQ/GPTQ checkpoints are 4-bit weight-only)
QUANT = {"fp8": "fp8", "modelopt": "fp8", "fbgemm_fp8": "fp8", "modelopt_fp4": "fp4",
         "awq": "int4", "awq_marlin": "int4", "gptq": "int4", "gptq_marlin": "int4",
         "experts_int8": "int8"}
KV = {"auto": None, "fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8"}
DTYPES = {"auto": "bfloat16", "bfloat16": "bfloat16", "half": "float16", "float16": "float16"}


def read(text: str, where: str, context: Mapping[str, Any]) -> Imported:
    words = split_argv(text, where)
    if words[:2] == ["vllm", "serve"]:
        words = words[2:]
    args, unknown = parse_flags(words, where, flags=FLAGS, aliases=ALIASES)
    ignored = [f"{w} (not modelled)" for w in unknown if w.startswith("-")]
    notes = [f"model {w}: the model is zrt's MODEL" for w in unknown if not w.startswith("-")]
    if "--model" in args:
        notes.append(f"--model {args['--model']}: the model is zrt's MODEL")
    tp = as_int(args.get("--tensor-parallel-size", 1), "--tensor-parallel-size", where)
    pp = as_int(args.get("--pipeline-parallel-size", 1), "--pipeline-parallel-size", where)
    dp = as_int(args.get("--data-parallel-size", 1), "--data-parallel-size", where)
    values: dict[str, Any] = {"mode": "infer", "engine": "vllm", "tp": tp, "pp": pp, "dp": dp}
    if args.get("--enable-expert-parallel"):
        # vLLM's MoE layers then use EP over TP × DP ranks, experts whole on each rank
        values["ep"], values["etp"] = tp * dp, 1
    elif dp > 1:
        # without it "expert layers form a tensor parallel group of size DP × TP"
        # (vLLM's Data Parallel Deployment page)
        values["etp"] = tp * dp
    if "--max-num-seqs" in args:
        values["batch"] = as_int(args["--max-num-seqs"], "--max-num-seqs", where)
    else:
        notes.append("no --max-num-seqs: zrt takes the largest batch that fits")
    values["quant"] = "none"
    if "--quantization" in args:
        values["quant"] = choice(args["--quantization"], "--quantization", where, QUANT)
    if "--kv-cache-dtype" in args:
        kv = choice(args["--kv-cache-dtype"], "--kv-cache-dtype", where, KV)
        if kv is not None:
            values["kv_dtype"] = kv
    if "--dtype" in args:
        values["dtype"] = choice(args["--dtype"], "--dtype", where, DTYPES)
    return Imported("vllm", values, tuple(ignored), tuple(notes))


def write(request: RunRequest, header: Header) -> str:
    infer = request.infer
    if infer is None:
        raise SpecError("--emit vllm writes a serving run; this is a training run",
                        "use --emit megatron, bridge, torchtitan or deepspeed")
    p = request.parallel
    if p.cp > 1 or p.vp > 1:
        raise SpecError(f"vllm serve has no option for cp={p.cp} / vp={p.vp}",
                        "use cp 1 and vp 1, or --emit trtllm")
    args = [f"--tensor-parallel-size {p.tp}", f"--pipeline-parallel-size {p.pp}",
            f"--data-parallel-size {p.dp}"]
    if header.experts != 0 and p.ep > 1:
        if p.ep != p.tp * p.dp or p.expert_tp != 1:
            raise SpecError(f"vLLM's expert parallelism spans tp × dp = {p.tp * p.dp} ranks "
                            f"with whole experts; ep={p.ep}, etp={p.expert_tp} is not it",
                            f"use --ep {p.tp * p.dp} --etp 1, or ep 1")
        args.append("--enable-expert-parallel")
    elif header.experts != 0 and p.etp is not None and p.expert_tp != p.tp * p.dp and \
            not (p.dp == 1 and p.expert_tp == p.tp):
        raise SpecError(f"vLLM without expert parallelism splits each expert over tp × dp = "
                        f"{p.tp * p.dp} ranks; etp={p.expert_tp} is not it",
                        f"use --etp {p.tp * p.dp}, or --ep {p.tp * p.dp} --etp 1")
    if infer.batch is not None:
        args.append(f"--max-num-seqs {infer.batch}")
    if infer.quant != "none":
        args.append("--quantization " + {"fp8": "fp8", "fp4": "modelopt_fp4", "int4": "awq",
                                         "int8": "experts_int8"}[infer.quant])
    kv = {None: "auto", "fp8": "fp8"}.get(infer.kv_dtype)
    if kv is None:
        raise SpecError(f"vLLM's --kv-cache-dtype has no {infer.kv_dtype}",
                        "use fp8, or leave the KV cache in the model's dtype")
    args.append(f"--kv-cache-dtype {kv}")
    dtype = {"bfloat16": "bfloat16", "float16": "float16"}.get(infer.dtype)
    if dtype is None:
        raise SpecError(f"vLLM's --dtype has no {infer.dtype}", "use bfloat16 or float16")
    args.append(f"--dtype {dtype}")
    head = "".join(f"# {line}\n" for line in header.lines("vLLM launch"))
    head += (f"# workload: input_len {infer.input_len}, output_len {infer.output_len} "
             "(the benchmark's dataset)\n")
    body = " \\\n    ".join(args)
    return f"{head}vllm serve {shlex.quote(header.model)} \\\n    {body}\n"
