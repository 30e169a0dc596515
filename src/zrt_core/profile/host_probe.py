"""The eager host's cost, for ``zrt calibrate`` (:mod:`zrt_core.profile.calibrate`): a
small transformers decoder run eagerly on the device at several depths, four passes
(training forward, its backward, a no-grad prefill, a decode step over a KV cache), each
fitted as µs per node of zrt's capture of the pass plus µs once per pass. ``zrt diff``'s
host model (:mod:`zrt_core.profile.diff`) prices a measured step's host with them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attrs import evolve, frozen

from zrt_core.profile.device import Device, significant


@frozen
class EagerHost:
    """The eager host's cost (:func:`eager_host`), µs: per node and once per pass, for a
    training forward, its backward, an inference forward and a decode step
    (``zrt_core.profile.diff``'s ``HOST_PASSES``)."""

    per_node_us: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0)
    fixed_us: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0)

    def to_efficiency(self) -> dict[str, float]:
        """The pack's ``efficiency`` keys; a pass not timed (0 per node: a calibration
        saved before the decode probe) is left out, so the pack falls back as documented
        in ``hardware.py``."""
        names = ("eager_host", "eager_host_backward", "eager_host_infer", "eager_host_decode")
        out: dict[str, float] = {}
        for name, node, fixed in zip(names, self.per_node_us, self.fixed_us, strict=True):
            if node > 0 or name == "eager_host":
                out[f"{name}_us"] = significant(node)
                out[f"{name}_fixed_us"] = significant(fixed)
        return out

    def to_json(self) -> dict[str, Any]:
        from zrt_core.profile.diff import HOST_PASSES

        return {"per_node_us": dict(zip(HOST_PASSES, self.per_node_us, strict=True)),
                "fixed_us": dict(zip(HOST_PASSES, self.fixed_us, strict=True))}



#: the small eager decoder :func:`eager_host` times (its ops' own work is microseconds), at
#: :data:`HOST_PROBE_DEPTHS` layers
HOST_PROBE = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
              "vocab_size": 128}
HOST_PROBE_TOKENS = (1, 16)  # batch, sequence
HOST_PROBE_DEPTHS = (2, 4, 6, 8)


def host_line(times_s: Sequence[float], nodes: Sequence[int]) -> tuple[float, float]:
    """(µs per node, fixed µs) of the least-squares line through a probe's (nodes, time)
    points, one per depth. Points the noise left not rising (a slope not above zero) give
    no line: the deepest probe's average per node, and no fixed cost; a line meeting zero
    nodes below zero time, no fixed cost."""
    n = len(nodes)
    mean_n, mean_t = sum(nodes) / n, sum(times_s) / n
    var = sum((x - mean_n) ** 2 for x in nodes)
    cov = sum((x - mean_n) * (t - mean_t) for x, t in zip(nodes, times_s, strict=True))
    if var <= 0 or cov <= 0:
        deepest = max(range(n), key=lambda i: nodes[i])
        return times_s[deepest] / nodes[deepest] * 1e6, 0.0
    per_node = cov / var
    return per_node * 1e6, max(0.0, mean_t - per_node * mean_n) * 1e6


def eager_host(device: Device, repeats: int) -> EagerHost:
    """The host's µs per node and per pass of an eager training forward (with the loss), of
    its backward, of a forward under ``torch.no_grad`` (as ``zrt measure`` runs prefill) and
    of a decode step over a KV cache (as ``zrt measure`` runs it): the best wall time (CPU time with one CPU thread) of each at each of
    :data:`HOST_PROBE_DEPTHS`, the depths taken in turn within each repeat (a slow spell of
    a shared machine falls on all of them alike), against the nodes zrt's capture of the
    same pass counts (views included: each is a dispatch), fitted by :func:`host_line`."""
    import time

    import torch

    from zrt_core.capture.api import capture
    from zrt_core.plugins import get_plugin_manager
    from zrt_core.profile.device import cpu_clock, synchronize
    from zrt_core.profile.measure import MeasureRequest, build_model, step_calls

    host = get_plugin_manager()
    batch, seq = HOST_PROBE_TOKENS
    clock = time.perf_counter if device.kind == "cuda" else cpu_clock(device)
    phases = ("train_forward", "train_backward", "prefill", "decode")
    models = []
    decodes = []
    nodes: list[tuple[int, ...]] = []
    for depth in HOST_PROBE_DEPTHS:
        config = dict(HOST_PROBE, num_hidden_layers=depth)
        request = MeasureRequest(model=dict(config), mode="train", batch=batch, seq_len=seq)
        model = build_model(request, device, host)[2]
        models.append(model)
        # zrt measure's decode step on the same model: one token over a cache of ``seq``,
        # the cache cropped back and made contiguous before each call (untimed)
        step, prepare, _ = step_calls(model, evolve(request, mode="decode"), device, config)
        decodes.append((step, prepare))
        captured = capture(config, phases, batch=batch, seq_len=seq, host=host,
                           full_depth=True, dtype="float32", last_token_logits=True)
        graphs = [captured.graph(p) for p in phases]
        nodes.append(tuple(sum(g.multiplicity(n) for n in g.nodes) for g in graphs))
    ids = torch.randint(0, HOST_PROBE["vocab_size"], (batch, seq), device=device.torch_device)

    def once(d: int, mode: str) -> float:
        model = models[d]
        for p in model.parameters():
            p.grad = None
        if mode == "decode":
            decodes[d][1]()
        synchronize(device)
        t0 = clock()
        if mode == "decode":
            decodes[d][0]()
        elif mode == "infer":
            with torch.no_grad():  # as zrt measure's prefill
                model(input_ids=ids, logits_to_keep=1)
        else:
            out = model(input_ids=ids, labels=ids)
            if mode == "both":
                out.loss.backward()
        synchronize(device)
        return clock() - t0

    modes = ("train", "both", "infer", "decode")
    best = {(d, m): float("inf") for d in range(len(models)) for m in modes}
    for i in range(repeats + 2):  # two warm-ups
        for (d, mode) in best:
            seconds = once(d, mode)
            if i >= 2:
                best[d, mode] = min(best[d, mode], seconds)
    times = [(best[d, "train"], max(0.0, best[d, "both"] - best[d, "train"]), best[d, "infer"],
              best[d, "decode"]) for d in range(len(models))]
    lines = [host_line([t[i] for t in times], [n[i] for n in nodes])
             for i in range(len(modes))]
    return EagerHost(per_node_us=tuple(line[0] for line in lines),  # type: ignore[arg-type]
                     fixed_us=tuple(line[1] for line in lines))  # type: ignore[arg-type]
