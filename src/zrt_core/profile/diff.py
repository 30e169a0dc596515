"""``zrt diff``: line a ``zrt measure`` result up with zrt's prediction of the same model,
step and shapes on a hardware spec (a calibrated pack, typically), per layer, per
sub-module and per op category, with the end-to-end ratio predicted / measured.

The prediction is the captured graph of every decoder layer (``full_depth``) priced node by
node by the hardware's cost backends (one device, no parallelism; eager PyTorch runs one op
after the other). Where the hardware has an eager host cost (``efficiency.eager_host_us``,
measured by ``zrt calibrate``), the host issues every node (views too) at that cost: on a
GPU beside the device, each kernel starting when both the host has issued it and the
device has finished the one before; on a CPU, where the host thread runs the ops itself,
before each op (the op's own dispatch, ``launch_overhead_us``, is then the host's). The
cost per node and the fixed cost of each pass (model-level Python no node stands for) are
the pack's for the pass: a training forward, its backward, or a forward without autograd
(prefill and decode). Without it the node times are summed.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from zrt_core._data import read_json_file
from zrt_core.errors import ZrtError
from zrt_core.profile.measure import SCHEMA

_PHASES = {"train": ("train_forward", "train_backward"), "prefill": ("prefill",),
           "decode": ("decode",)}
_LAYER_CHILD = re.compile(r"(?:^|\.)(?:layers|h)\.(\d+)(?:\.([^.]+))?")
#: profiler names of the CPU/CUDA attention kernels → the graph's attention category
_ATTENTION_KERNELS = ("flash_attention", "efficient_attention", "cudnn_attention",
                      "scaled_dot_product")


class MeasurementError(ZrtError):
    """A measurement file zrt diff cannot read."""


def load_measurement(path: str | Path) -> dict[str, Any]:
    """A ``zrt measure --json`` file, checked for the fields the diff needs."""
    data = read_json_file(path, "give the file zrt measure --json wrote", MeasurementError)
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise MeasurementError(f"{path} is not a zrt measure result (schema {SCHEMA})",
                               "write it with zrt measure MODEL --json > FILE")
    for key in ("config", "mode", "batch", "seq_len", "dtype", "step_s", "layers"):
        if key not in data:
            raise MeasurementError(f"{path}: missing field {key!r}",
                                   "write it again with zrt measure --json")
    if data["mode"] not in _PHASES:
        raise MeasurementError(f"{path}: unknown mode {data['mode']!r}")
    if not (isinstance(data["step_s"], (int, float)) and data["step_s"] > 0):
        raise MeasurementError(f"{path}: step_s must be a positive number")
    return data


def predict(measurement: Mapping[str, Any], hardware: Any, host: Any,
            backends: Sequence[Any] | None = None) -> list[Any]:
    """The costed graphs (one per phase) of the measured step on ``hardware``."""
    from zrt_core.capture.api import capture
    from zrt_core.cost.pricing import price_graph

    phases = _PHASES[measurement["mode"]]
    captured = capture(dict(measurement["config"]), phases, batch=int(measurement["batch"]),
                       seq_len=int(measurement["seq_len"]), host=host, full_depth=True,
                       dtype=str(measurement["dtype"]), last_token_logits=True)
    return [price_graph(captured.graph(p), hardware, host, backends=backends) for p in phases]


#: the host's passes: a training forward (autograd records), its backward (the C++ autograd
#: engine issues), an inference forward (``torch.no_grad``: prefill) and a decode step (one
#: token over a KV cache: the cache's update is Python of its own)
HOST_PASSES = ("forward", "backward", "infer", "decode")


def host_pass(phase: str) -> str:
    """The host pass (:data:`HOST_PASSES`) a captured phase runs as."""
    return {"train_forward": "forward", "train_backward": "backward",
            "decode": "decode"}.get(phase, "infer")


class HostClock:
    """The eager host beside the device: :meth:`start` begins a pass, :meth:`advance` runs
    one node; each says how far the step's end moved (module docstring).

    :param per_node: host seconds per node of each pass (:data:`HOST_PASSES`).
    :param fixed: host seconds once per pass (model-level Python no node stands for).
    :param serial: the host runs the ops itself (a CPU): time adds; else (a GPU) the host
        issues ahead of the device and each kernel waits for the later of the two.
    :param dispatch_s: the dispatch every priced node's time already holds, taken off it
        (the host pays it).
    """

    def __init__(self, per_node: Mapping[str, float], *, serial: bool, dispatch_s: float,
                 fixed: Mapping[str, float] | None = None) -> None:
        self.per_node = dict(per_node)
        self.fixed = dict(fixed or {})
        self.serial = serial
        self.dispatch_s = dispatch_s
        self.host = 0.0
        self.device = 0.0
        self.kind = "forward"

    def start(self, kind: str) -> float:
        """Begin a pass of ``kind``: the host pays its fixed cost first."""
        self.kind = kind
        before = self.device
        fixed = self.fixed.get(kind, 0.0)
        if self.serial:
            self.device += fixed
        else:  # the host falls behind (it waits for no kernel); the device, only if it
            self.host += fixed  # catches up
        return self.device - before

    def advance(self, node_s: float, copies: int = 1) -> float:
        """Run ``copies`` of a node whose priced time is ``node_s`` (0: a view) in the
        current pass: the seconds the step's end moved."""
        before = self.device
        own = max(0.0, node_s - self.dispatch_s) if node_s > 0 else 0.0
        per_node = self.per_node[self.kind]
        for _ in range(copies):
            if self.serial:  # one thread: the host's part, then the op's own
                self.device += per_node + own
            else:  # the host issues on; the kernel waits for it and for the one before
                self.host += per_node
                self.device = max(self.device, self.host) + own
        return self.device - before


def host_clock(measurement: Mapping[str, Any], hardware: Any) -> HostClock | None:
    """The host model for ``measurement`` on ``hardware``; None without an eager host cost.
    A pack without a cost of its own for the inference pass (written before it was
    measured) uses the training forward's; one without a decode pass, the inference
    pass's."""
    eff = getattr(hardware, "efficiency", None)
    if eff is None or not eff.eager_host_us:
        return None
    serial = (measurement.get("device") or {}).get("kind", "cuda") == "cpu"
    infer = eff.eager_host_infer_us or eff.eager_host_us
    infer_fixed = (eff.eager_host_infer_fixed_us if eff.eager_host_infer_us
                   else eff.eager_host_fixed_us)
    per_node = {"forward": eff.eager_host_us, "backward": eff.eager_host_backward_us,
                "infer": infer, "decode": eff.eager_host_decode_us or infer}
    fixed = {"forward": eff.eager_host_fixed_us,
             "backward": eff.eager_host_backward_fixed_us, "infer": infer_fixed,
             "decode": eff.eager_host_decode_fixed_us if eff.eager_host_decode_us
             else infer_fixed}
    return HostClock({k: v * 1e-6 for k, v in per_node.items()}, serial=serial,
                     dispatch_s=eff.launch_overhead_us * 1e-6,
                     fixed={k: v * 1e-6 for k, v in fixed.items()})


def diff(measurement: Mapping[str, Any], costed: Sequence[Any],
         hardware: Any = None) -> dict[str, Any]:
    """The comparison as a JSON-ready mapping: ``end_to_end_ratio``, ``layers``,
    ``modules``, ``categories``, ``timelines``, ``coverage``; with ``hardware``'s eager host
    cost, the host runs beside the device (:class:`HostClock`)."""
    measured_layers = {int(r["index"]): r for r in measurement["layers"]}
    host = host_clock(measurement, hardware)
    layer_pred: dict[int, dict[str, float]] = {}
    module_pred: dict[str, dict[str, float]] = {}
    category_pred: dict[str, float] = {}
    op_category: dict[str, str] = {}
    predicted_timeline: list[dict[str, Any]] = []
    clock = 0.0
    total = 0.0
    device_total = 0.0
    for cg in costed:
        graph = cg.graph
        backward = "backward" in graph.phase
        side = "backward_s" if backward else "forward_s"
        span: dict[int, list[float]] = {}
        if host is not None:  # the pass's fixed host cost: before its first node (on a GPU,
            # the device feels it only where the first nodes wait for the host)
            moved = host.start(host_pass(graph.phase))
            total += moved
            clock += moved
        for node in graph.nodes:
            copies = graph.multiplicity(node)
            node_s = cg.costs[node.id].time_s
            device_s = node_s * copies
            seconds = device_s if host is None else host.advance(node_s, copies)
            total += seconds
            device_total += device_s
            op_category.setdefault(_base(node.op), node.category)
            category_pred[node.category] = category_pred.get(node.category, 0.0) + device_s
            if node.layer_index is not None:
                row = layer_pred.setdefault(node.layer_index, {"forward_s": 0.0,
                                                              "backward_s": 0.0})
                row[side] += seconds
                found = _LAYER_CHILD.search(node.module_path or "")
                if found and found.group(2):
                    m = module_pred.setdefault(found.group(2), {"forward_s": 0.0,
                                                               "backward_s": 0.0})
                    m[side] += seconds
                s = span.setdefault(node.layer_index, [clock, clock])
                s[1] = clock + seconds
            clock += seconds
        for index, (start, end) in span.items():
            predicted_timeline.append({"name": f"layer {index} {'bwd' if backward else 'fwd'}",
                                       "layer": index, "phase": "bwd" if backward else "fwd",
                                       "start_s": start, "dur_s": end - start})
    measured_s = float(measurement["step_s"])
    layers = []
    for index in sorted(set(measured_layers) | set(layer_pred)):
        pred = layer_pred.get(index, {"forward_s": 0.0, "backward_s": 0.0})
        meas = measured_layers.get(index, {"forward_s": 0.0, "backward_s": 0.0})
        p_total = pred["forward_s"] + pred["backward_s"]
        m_total = float(meas["forward_s"]) + float(meas["backward_s"])
        layers.append({"index": index, "predicted_s": p_total, "measured_s": m_total,
                       "predicted_forward_s": pred["forward_s"],
                       "measured_forward_s": float(meas["forward_s"]),
                       "predicted_backward_s": pred["backward_s"],
                       "measured_backward_s": float(meas["backward_s"]),
                       "error": _error(p_total, m_total)})
    modules = []
    measured_modules = {r["name"]: r for r in measurement.get("modules", [])}
    for name in sorted(set(measured_modules) | set(module_pred)):
        pred = module_pred.get(name, {"forward_s": 0.0, "backward_s": 0.0})
        p_total = pred["forward_s"] + pred["backward_s"]
        m_total = float(measured_modules.get(name, {}).get("total_s", 0.0))
        modules.append({"name": name, "predicted_s": p_total, "measured_s": m_total,
                        "error": _error(p_total, m_total)})
    category_meas: dict[str, float] = {}
    for k in measurement.get("kernels", []):
        cat = _kernel_category(k["op"], op_category)
        category_meas[cat] = category_meas.get(cat, 0.0) + float(k["self_s"])
    categories = [{"category": c, "predicted_s": category_pred.get(c, 0.0),
                   "measured_s": category_meas.get(c, 0.0),
                   "error": _error(category_pred.get(c, 0.0), category_meas.get(c, 0.0))}
                  for c in sorted(set(category_pred) | set(category_meas))
                  if category_pred.get(c, 0.0) > 0 or category_meas.get(c, 0.0) > 0]
    errors = [abs(r["error"]) for r in layers if r["error"] is not None]
    # the ops' own time (device time on a GPU): the step less this is time no op ran — the
    # host issuing eager ops slower than the GPU runs them, or Python on a CPU
    op_s = sum(float(k["self_s"]) for k in measurement.get("kernels", []))
    from zrt_core.cost.coverage import coverage

    return {
        "model": measurement.get("model"),
        "mode": measurement["mode"],
        "batch": measurement["batch"],
        "seq_len": measurement["seq_len"],
        "hardware_id": costed[0].hardware_id if costed else None,
        "predicted_s": total,
        "measured_s": measured_s,
        "end_to_end_ratio": total / measured_s,
        "predicted_op_s": device_total,
        "measured_op_s": op_s,
        "op_ratio": device_total / op_s if op_s > 0 else None,
        "host_model": None if host is None else {
            **{f"{k}_us": host.per_node[k] * 1e6 for k in HOST_PASSES},
            **{f"{k}_fixed_us": host.fixed.get(k, 0.0) * 1e6 for k in HOST_PASSES},
            "serial": host.serial},
        "layer_mape": sum(errors) / len(errors) if errors else None,
        "layers": layers,
        "modules": modules,
        "categories": categories,
        "coverage": coverage(costed),
        "timelines": {"measured": measurement.get("timeline", []),
                      "predicted": sorted(predicted_timeline, key=lambda e: e["start_s"])},
    }


def _base(op: str) -> str:
    """``aten.mm.default`` → ``aten.mm``; ``aten::mm`` → ``aten.mm``."""
    op = op.replace("::", ".")
    return op.rsplit(".", 1)[0] if op.count(".") >= 2 else op


def _kernel_category(op: str, op_category: Mapping[str, str]) -> str:
    if any(k in op for k in _ATTENTION_KERNELS):
        return "attention"
    return op_category.get(_base(op), "other")


def _error(predicted: float, measured: float) -> float | None:
    """(predicted − measured) / measured; None when nothing was measured."""
    return (predicted - measured) / measured if measured > 0 else None


def write_html(result: Mapping[str, Any], path: str | Path) -> Path:
    """A self-contained page: the two timelines side by side and the three tables."""
    path = Path(path)
    timelines = result["timelines"]
    horizon = max([e["start_s"] + e["dur_s"] for t in timelines.values() for e in t]
                  + [1e-9])
    width = 1000.0

    def lane(events: Sequence[Mapping[str, Any]], y: int, label: str) -> str:
        parts = [f'<text x="0" y="{y + 14}">{html.escape(label)}</text>']
        for e in events:
            x = 120 + width * e["start_s"] / horizon
            w = max(1.0, width * e["dur_s"] / horizon)
            hue = (int(e.get("layer", 0)) * 47) % 360
            light = 45 if e.get("phase") == "fwd" else 70
            parts.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="20" '
                         f'fill="hsl({hue},60%,{light}%)"><title>'
                         f'{html.escape(str(e["name"]))}: {e["dur_s"] * 1e3:.3f} ms'
                         f'</title></rect>')
        return "".join(parts)

    svg = (f'<svg width="{width + 140:.0f}" height="70" font-family="sans-serif" '
           f'font-size="12">{lane(timelines["measured"], 5, "measured")}'
           f'{lane(timelines["predicted"], 40, "predicted")}</svg>')

    def rows(items: Sequence[Mapping[str, Any]], key: str) -> str:
        out = []
        for r in items:
            err = "—" if r["error"] is None else f"{r['error']:+.1%}"
            out.append(f"<tr><td>{html.escape(str(r[key]))}</td>"
                       f"<td>{r['predicted_s'] * 1e3:.3f}</td>"
                       f"<td>{r['measured_s'] * 1e3:.3f}</td><td>{err}</td></tr>")
        return "".join(out)

    head = "<tr><th>{}</th><th>predicted ms</th><th>measured ms</th><th>error</th></tr>"
    body = (f"<h1>zrt diff: {html.escape(str(result['model']))} {result['mode']}</h1>"
            f"<p>predicted {result['predicted_s'] * 1e3:.3f} ms, measured "
            f"{result['measured_s'] * 1e3:.3f} ms, ratio {result['end_to_end_ratio']:.3f}"
            f" on {html.escape(str(result['hardware_id']))}</p>{svg}"
            f"<h2>Layers</h2><table>{head.format('layer')}{rows(result['layers'], 'index')}"
            f"</table><h2>Sub-modules</h2><table>{head.format('module')}"
            f"{rows(result['modules'], 'name')}</table><h2>Op categories</h2><table>"
            f"{head.format('category')}{rows(result['categories'], 'category')}</table>")
    path.write_text("<!doctype html><meta charset='utf-8'><title>zrt diff</title><style>"
                    "body{font-family:sans-serif}td,th{padding:2px 8px;text-align:right}"
                    "</style>" + body, encoding="utf-8")
    return path


def mape(values: Sequence[float | None]) -> float:
    vals = [abs(v) for v in values if v is not None and math.isfinite(v)]
    return sum(vals) / len(vals) if vals else float("nan")
