"""Predict every inference record of a validation file and print the errors.

    python benchmarks/bench_infer_validation.py [FILE] [--only SUBSTR] [--json OUT]
        [--engine trtllm] [--verbose]

For each ``workload: infer`` record: the model from its ``hf_config``, the hardware id,
the layout (``tp``/``pp``/``ep``/``dp``/``cp``; nulls are 1), the precision mapped to zrt's
quantisation (``fp8`` → W8A8 fp8, ``nvfp4`` → W4A4 NVFP4; ``bf16``/``fp16`` → none) with
the KV cache in fp8 for the quantised ModelOpt checkpoints (their ``hf_quant_config``
sets ``kv_cache_quant_algo: FP8``), ``input_len``/``output_len``, and ``concurrency`` (or
``max_batch``) as the batch — null means offline max-throughput, the mode
``trtllm-bench`` runs. Prints per record the predicted and measured output throughput
(and TTFT/TPOT where measured) with ``(predicted − measured) / measured``, then the MAPE,
the worst records, and how long the estimates took (captures excluded; they are cached
on disk after the first run).

This stands in for ``zrt validate`` on inference records until that command exists.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _bench import VALIDATION as DEFAULT_FILE
from _bench import result

#: Output tokens/s MAPE over the serving records (docs/validation.md: 3.8%).
MAPE_TARGET = 0.10
#: One serving estimate, capture excluded (a re-estimate's budget).
ESTIMATE_TARGET_MS = 200.0

#: Record precision -> (zrt quantisation, KV-cache dtype).
PRECISION = {
    "fp8": ("fp8", "fp8"),
    "nvfp4": ("fp4", "fp8"),
    "mxfp8": ("fp8", "fp8"),
    "bf16": ("none", None),
    "fp16": ("none", None),
}
METRICS = ("output_tokens_per_s", "output_tokens_per_s_per_gpu", "ttft_ms", "tpot_ms")


def load_records(path: Path) -> list[dict[str, Any]]:
    import yaml

    with path.open(encoding="utf-8") as f:
        return [r for r in yaml.safe_load(f) if r.get("workload") == "infer"]


def case(record: dict[str, Any]) -> tuple[Any, Any, str, str | None]:
    """``(Parallel, InferSpec, dtype, note)`` of a record."""
    from zrt_core.strategy import InferSpec, Parallel

    lay = record.get("parallel") or {}

    def deg(key: str) -> int:
        v = lay.get(key)
        return int(v) if v else 1

    parallel = Parallel(tp=deg("tp"), pp=deg("pp"), vp=deg("vp"), cp=deg("cp"), ep=deg("ep"),
                        etp=(int(lay["etp"]) if lay.get("etp") else None), dp=deg("dp"),
                        sp=lay.get("sp"))
    precision = str(record.get("precision") or "bf16").lower()
    quant, kv = PRECISION.get(precision, ("none", None))
    dtype = "float16" if precision == "fp16" else "bfloat16"
    batch = record.get("concurrency") or record.get("max_batch")
    infer = InferSpec(input_len=int(record["input_len"]), output_len=int(record["output_len"]),
                      batch=int(batch) if batch else None, quant=quant, kv_dtype=kv,
                      dtype=dtype)
    return parallel, infer, dtype, None


def predict(record: dict[str, Any], host: Any, engine: str) -> dict[str, Any]:
    from zrt_core.estimate import estimate_inference, load_or_capture

    parallel, infer, dtype, _ = case(record)
    config = dict(record["model"]["hf_config"])
    config.setdefault("_name_or_path", record["model"].get("name", "config"))
    t0 = time.perf_counter()
    captured = load_or_capture(config, infer.input_len, host=host, dtype=dtype)
    t1 = time.perf_counter()
    report = estimate_inference(None, record["hardware"], parallel, infer, host=host,
                                captured=captured, engine=engine)
    t2 = time.perf_counter()
    out = report.to_json()
    predicted = {k: out[k] for k in METRICS}
    return {"report": report, "predicted": predicted, "capture_s": t1 - t0,
            "estimate_s": t2 - t1}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?", default=str(DEFAULT_FILE))
    ap.add_argument("--only", default="", help="records whose id contains this")
    ap.add_argument("--engine", default="trtllm", help="serving engine profile")
    ap.add_argument("--json", metavar="OUT", help="write per-record results here")
    ap.add_argument("--verbose", action="store_true", help="print the throughput model")
    args = ap.parse_args(argv)

    from zrt_core.plugins import get_plugin_manager

    host = get_plugin_manager()
    records = [r for r in load_records(Path(args.file)) if args.only in r["id"]]
    rows = []
    errors: list[float] = []
    estimate_times: list[float] = []
    print(f"{'record':<62} {'pred tok/s':>11} {'meas tok/s':>11} {'error':>8}  batch")
    for rec in records:
        try:
            res = predict(rec, host, args.engine)
        except Exception as exc:  # a record zrt cannot predict: say why, go on
            print(f"{rec['id']:<62} error: {type(exc).__name__}: {exc}")
            rows.append({"id": rec["id"], "status": "error", "message": str(exc)})
            continue
        measured = rec.get("measured") or {}
        err = {k: (res["predicted"][k] - measured[k]) / measured[k]
               for k in METRICS if measured.get(k) and res["predicted"].get(k) is not None}
        estimate_times.append(res["estimate_s"])
        key = "output_tokens_per_s"
        report = res["report"]
        if key in err:
            errors.append(err[key])
            print(f"{rec['id']:<62} {res['predicted'][key]:>11.0f} {measured[key]:>11.0f} "
                  f"{err[key]:>+8.1%}  {report.batch}")
        if args.verbose:
            print("    ", json.dumps(dict(report.throughput), default=str))
        rows.append({"id": rec["id"], "status": "ok", "predicted": res["predicted"],
                     "measured": {k: measured[k] for k in METRICS if k in measured},
                     "error": err, "batch": report.batch,
                     "throughput_model": dict(report.throughput),
                     "estimate_s": res["estimate_s"]})
    if errors:
        mape = statistics.fmean(abs(e) for e in errors)
        bias = statistics.fmean(errors)
        print(f"\n{len(errors)} records: MAPE {mape:.1%} (output tokens/s), mean signed "
              f"error {bias:+.1%}")
        worst = sorted((r for r in rows if r.get("status") == "ok"),
                       key=lambda r: -abs(r["error"].get("output_tokens_per_s", 0)))[:5]
        print("worst:", ", ".join(f"{r['id']} {r['error']['output_tokens_per_s']:+.1%}"
                                  for r in worst))
        groups: dict[str, list[float]] = {}
        for r in rows:
            if r.get("status") == "ok" and "output_tokens_per_s" in r["error"]:
                group = r["id"].rsplit("-isl", 1)[0]
                groups.setdefault(group, []).append(r["error"]["output_tokens_per_s"])
        for g, errs in groups.items():
            print(f"  {g}: MAPE {statistics.fmean(abs(e) for e in errs):.1%}, "
                  f"bias {statistics.fmean(errs):+.1%} over {len(errs)}")
    if estimate_times:
        print(f"estimate time (capture excluded): median "
              f"{statistics.median(estimate_times) * 1e3:.0f} ms, max "
              f"{max(estimate_times) * 1e3:.0f} ms")
    result(f"output tokens/s MAPE over {len(errors)} serving records",
           100 * statistics.fmean(abs(e) for e in errors) if errors else None,
           100 * MAPE_TARGET, "%")
    result("serving estimate per record (capture excluded), median",
           statistics.median(estimate_times) * 1e3 if estimate_times else None,
           ESTIMATE_TARGET_MS, "ms")
    if args.json:
        Path(args.json).write_text(json.dumps({"records": rows}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
