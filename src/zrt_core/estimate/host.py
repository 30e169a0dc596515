"""The host side of an eager training step: kernel launches the CPU issues one by one, and
the device-to-host syncs of dropless MoE layers that stop it from running ahead.

docs/moe-training.md derives the model; ``exposed_host_s`` is what ``estimate_training``
adds to each stage's forward and backward as exposed ``host`` time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from attrs import frozen

from zrt_core.cost.opdims import EXPERT_GROUPS_ATTR
from zrt_core.ir.graph import Category, OpGraph

if TYPE_CHECKING:
    from zrt_core.cost.backend import NodeCost

#: Grouped GEMMs as TransformerEngine's ``GroupedLinear`` runs them: ``general_grouped_gemm``
#: → ``nvte_multi_stream_cublas_gemm``, one cuBLASLt GEMM launched per local expert
#: (``transformer_engine/common/gemm/cublaslt_gemm.cu``, ``multi_stream_cublas_gemm``).
GROUPED_GEMM_OPS = frozenset({"_grouped_mm", "_scaled_grouped_mm", "grouped_mm_fallback"})


@frozen
class HostModel:
    """How the host issues a training step's kernels.

    :param launch_s: host time per kernel launch (PyTorch eager dispatch, the module code
        around it and the driver call), a property of the host CPU: the hardware's
        ``efficiency.host_launch_us``; 0 turns the model off.
    :param moe_sync: dropless MoE layers copy their routing counts to the host in the
        forward (Megatron-Core's token dispatchers; TE's grouped GEMM needs the splits on the
        host), so the host waits for the device there; False for token-drop runs padded to
        capacity (static shapes, no sync).
    """

    launch_s: float = 0.0
    moe_sync: bool = True

    @classmethod
    def of(cls, hw: Any, *, eager: bool = True, moe_sync: bool = True) -> HostModel:
        """The host model of a training step on ``hw``: its ``host_launch_us`` per launch
        when the step runs eagerly (no CUDA graphs), none otherwise."""
        return cls(launch_s=hw.efficiency.host_launch_us * 1e-6 if eager else 0.0,
                   moe_sync=moe_sync)


@frozen
class LayerHost:
    """One layer's forward host work, split at its sync point (if it has one).

    ``seq_before`` / ``seq_after``: the part's nodes in issue order as ``(launches, device
    seconds)``, for :func:`issue_order_s`; empty, the part is taken as one node of its
    totals."""

    launches_before: int
    gpu_before_s: float
    launches_after: int = 0
    gpu_after_s: float = 0.0
    syncs: bool = False
    seq_before: tuple[tuple[int, float], ...] = ()
    seq_after: tuple[tuple[int, float], ...] = ()

    def before(self) -> tuple[tuple[int, float], ...]:
        return self.seq_before or ((self.launches_before, self.gpu_before_s),)

    def after(self) -> tuple[tuple[int, float], ...]:
        return self.seq_after or ((self.launches_after, self.gpu_after_s),)

    @property
    def launches(self) -> int:
        return self.launches_before + self.launches_after

    @property
    def gpu_s(self) -> float:
        return self.gpu_before_s + self.gpu_after_s


#: A layer the forward tables do not hold: nothing launched, nothing run.
_NO_HOST = LayerHost(0, 0.0)


def _op(node) -> str:
    return node.op.split(".")[1] if node.op.count(".") else node.op


def grouped_inputs(graph: OpGraph) -> dict[int, int]:
    """Quantize nodes feeding a grouped GEMM → its local groups: TransformerEngine's
    ``GroupedLinear`` quantises each expert's split of the input separately
    (``tex.split_quantize``, one cast per split)."""
    groups = {n.id: len(n.attrs.get("group_rows") or ()) for n in graph.nodes
              if _op(n) in GROUPED_GEMM_OPS}
    quantize = {n.id for n in graph.nodes if n.op == "precision.quantize"}
    out: dict[int, int] = {}
    for e in graph.edges:
        src, dst = e[0], e[1]
        if src in quantize and groups.get(dst):
            out[src] = max(out.get(src, 0), groups[dst])
    return out


def launches(node, cost: NodeCost | None, splits: Mapping[int, int] | None = None) -> int:
    """Kernel launches the host issues for ``node``: none for views and zero-cost nodes,
    one per local expert for a grouped GEMM and for the cast of its input (``splits``,
    :func:`grouped_inputs`), one otherwise (a fused node is one kernel)."""
    if node.category == Category.VIEW or cost is None or cost.time_s <= 0.0:
        return 0
    if _op(node) in GROUPED_GEMM_OPS:
        return max(1, len(node.attrs.get("group_rows") or ()))
    return max(1, (splits or {}).get(node.id, 1), int(node.attrs.get(EXPERT_GROUPS_ATTR) or 0))


def layer_host(graph: OpGraph, costs: Mapping[int, NodeCost], *, moe_sync: bool
               ) -> dict[int | None, LayerHost]:
    """Per representative layer (``None``: outside the layers) of a forward graph: launches
    and GPU time before and after the layer's first MoE dispatch (its sync point)."""
    parts: dict[int | None, tuple[list[tuple[int, float]], list[tuple[int, float]]]] = {}
    synced: set[int | None] = set()
    splits = grouped_inputs(graph)
    for n in graph.nodes:
        before, after = parts.setdefault(n.layer_index, ([], []))
        c = costs.get(n.id)
        k = launches(n, c, splits)
        t = c.time_s if c is not None else 0.0
        if moe_sync and n.category == Category.MOE_DISPATCH:
            synced.add(n.layer_index)
        if k or t:
            (after if n.layer_index in synced else before).append((k, t))
    return {li: LayerHost(sum(k for k, _ in b), sum(t for _, t in b),
                          sum(k for k, _ in a), sum(t for _, t in a), li in synced,
                          tuple(b), tuple(a))
            for li, (b, a) in parts.items()}


def issue_order_s(seq: Sequence[tuple[int, float]], launch_s: float, scale: float,
                  host_s: float, device_s: float) -> tuple[float, float]:
    """When the host and the device are done with ``seq`` — nodes in issue order, each
    ``(launches, device seconds)`` — given when each was free before it: the host issues
    a node's kernels one after another (``launch_s`` each) and the device runs a kernel once
    it is issued and the kernel before it has finished (one stream, in order: the two-stage
    flow shop). A node of ``k`` launches runs as ``k`` equal kernels; its device time is
    scaled by ``scale`` (the stage's scheduled time over the nodes' sum). The device idles
    where the host has not issued the next kernel yet — at the start and behind a run of
    launch-heavy nodes even when the segment's device time exceeds its host time, which the
    totals' ``max(host, device)`` does not see."""
    host, dev = host_s, device_s
    for k, t in seq:
        g = t * scale
        if k <= 0:
            dev = max(dev, host) + g
            continue
        # k kernels of g / k, the i-th issued at host + i·launch_s: the device finishes at
        # max(dev + g, max over i of host + i·launch_s + (k − i + 1)·g/k), linear in i
        piece = g / k
        dev = max(dev + g, host + launch_s + g, host + k * launch_s + piece)
        host += k * launch_s
    return host, dev


def phase_host(graph: OpGraph, costs: Mapping[int, NodeCost]
               ) -> dict[int | None, tuple[int, float, tuple[tuple[int, float], ...]]]:
    """Per representative layer of a (backward) graph: launches, GPU time and the nodes in
    issue order as ``(launches, device seconds)`` (:func:`issue_order_s`)."""
    seqs: dict[int | None, list[tuple[int, float]]] = {}
    splits = grouped_inputs(graph)
    for n in graph.nodes:
        seq = seqs.setdefault(n.layer_index, [])
        c = costs.get(n.id)
        k = launches(n, c, splits)
        t = c.time_s if c is not None else 0.0
        if k or t:
            seq.append((k, t))
    return {li: (sum(k for k, _ in q), sum(t for _, t in q), tuple(q))
            for li, q in seqs.items()}


def _bwd_seq(entry: Sequence[Any]) -> Sequence[tuple[int, float]]:
    """A backward table entry's nodes in issue order (the entry as one node without them)."""
    return entry[2] if len(entry) > 2 and entry[2] else ((int(entry[0]), float(entry[1])),)


def launch_tables(model: HostModel, fwd: OpGraph, bwd: OpGraph,
                  fwd_costs: Mapping[int, NodeCost], bwd_costs: Mapping[int, NodeCost]
                  ) -> tuple[dict[int | None, LayerHost], dict[int | None, tuple[Any, ...]]]:
    """A stage pair's launches as :func:`exposed_host_s` reads them: the forward's per layer
    (:func:`layer_host`) and the backward's (:func:`phase_host`); empty when ``model``
    launches nothing."""
    if model.launch_s <= 0:
        return {}, {}
    return layer_host(fwd, fwd_costs, moe_sync=model.moe_sync), phase_host(bwd, bwd_costs)


def exposed_host_s(model: HostModel, layers: Sequence[int | None],
                   fwd: Mapping[int | None, LayerHost], bwd: Mapping[int | None, Sequence[Any]],
                   forward_s: float, backward_s: float) -> tuple[float, float]:
    """(forward, backward) host time the device waits for in one micro-batch of a stage.

    ``layers``: the stage's representative layer per position, ``None`` entries for the
    embedding / head side it holds. ``forward_s`` / ``backward_s``: the stage's scheduled
    device times, which the node sums are scaled to (overlapped communication).

    With dropless MoE syncs, each sync drains the device's queue and the host issues the
    next segment while the device runs what was issued, in issue order
    (:func:`issue_order_s`); the backward, which has no sync, runs the same way from an
    empty queue, layers reversed. The outer (embedding and head) nodes of the ``None``
    entry run where ``None`` stands in ``layers``, as one part. Without a sync the host runs
    ahead over the whole micro-batch, forward and backward: ``max(host, device)`` of the
    sum, counted on the backward.
    """
    c = model.launch_s
    if c <= 0.0:
        return 0.0, 0.0
    host_f = gpu_f = 0.0
    syncs = False
    for li in layers:
        lh = fwd.get(li)
        if lh is None:
            continue
        host_f += lh.launches * c
        gpu_f += lh.gpu_s
        syncs = syncs or lh.syncs
    if not syncs:
        host_b = sum(bwd.get(li, (0, 0.0))[0] for li in layers) * c
        return 0.0, max(0.0, host_f + host_b - forward_s - backward_s)
    scale_f = forward_s / gpu_f if gpu_f > 0 else 1.0
    # each sync drains the device's queue: the host waits for it, then issues the next
    # segment while the device runs it (issue_order_s)
    host = dev = 0.0
    for li in layers:
        lh = fwd.get(li)
        if lh is None:
            continue
        host, dev = issue_order_s(lh.before(), c, scale_f, host, dev)
        if lh.syncs:
            host = dev = max(host, dev)
        host, dev = issue_order_s(lh.after(), c, scale_f, host, dev)
    fwd_extra = max(0.0, dev - forward_s)
    # the backward has no sync: it runs in issue order from the last one, layers reversed
    gpu_b = sum(bwd.get(li, (0, 0.0))[1] for li in layers)
    scale_b = backward_s / gpu_b if gpu_b > 0 else 1.0
    host = dev = 0.0
    for li in reversed(layers):
        entry = bwd.get(li)
        if entry is not None:
            host, dev = issue_order_s(_bwd_seq(entry), c, scale_b, host, dev)
    return fwd_extra, max(0.0, dev - backward_s)


def paired_host_s(model: HostModel, layers: Sequence[int | None],
                  fwd: Mapping[int | None, LayerHost], bwd: Mapping[int | None, Sequence[Any]],
                  forward_s: float, backward_s: float) -> tuple[float, float]:
    """(forward, backward) host time the device waits for in one micro-batch of a stage when
    Megatron-Core's batch-level EP overlap pairs it with another
    (``--overlap-moe-expert-parallel-comm``; :func:`exposed_host_s` otherwise).

    The combined 1F1B issues one micro-batch's forward layer ``k`` and the other's backward
    layer ``L − 1 − k`` as one interleaved sequence of sub-modules
    (``TransformerLayerSchedulePlan.run``: combine backward, attention forward, MLP backward,
    dispatch forward, MLP weight gradients, dispatch backward, MLP forward, combine
    forward, attention backward; ``megatron/core/models/common/model_chunk_schedule_plan.py``),
    and the forward's dropless dispatch stops the host there for its routing counts. The
    backward's launches can no longer run ahead of the device over the whole micro-batch:
    a layer pair is two segments, each lasting ``max(host, device)`` — the forward layer
    up to its sync (with the few launches of the backward's combine), then the rest of the
    forward layer with the backward layer (its MLP, dispatch and attention). The embedding
    and head sides run outside the paired loop, each as its own segment. The exposed time
    is split over forward and backward as their launches are."""
    c = model.launch_s
    if c <= 0.0:
        return 0.0, 0.0
    gpu_f = sum(fwd.get(li, _NO_HOST).gpu_s for li in layers)
    gpu_b = sum(bwd.get(li, (0, 0.0))[1] for li in layers)
    scale_f = forward_s / gpu_f if gpu_f > 0 else 1.0
    scale_b = backward_s / gpu_b if gpu_b > 0 else 1.0
    inner = [li for li in layers if li is not None]
    exposed = 0.0
    for k, li in enumerate(inner):
        lf = fwd.get(li, _NO_HOST)
        kb, tb = bwd.get(inner[len(inner) - 1 - k], (0, 0.0))[:2]
        if lf.syncs:
            exposed += max(0.0, lf.launches_before * c - lf.gpu_before_s * scale_f)
            kf, tf = lf.launches_after, lf.gpu_after_s
        else:
            kf, tf = lf.launches_before, lf.gpu_before_s
        exposed += max(0.0, (kf + kb) * c - (tf * scale_f + tb * scale_b))
    if None in layers:  # the embedding / head side: a forward and a backward segment
        side = fwd.get(None, _NO_HOST)
        kb, tb = bwd.get(None, (0, 0.0))[:2]
        exposed += max(0.0, side.launches * c - side.gpu_s * scale_f) + \
            max(0.0, kb * c - tb * scale_b)
    launches_f = sum(fwd.get(li, _NO_HOST).launches for li in layers)
    launches_b = sum(bwd.get(li, (0, 0.0))[0] for li in layers)
    total = launches_f + launches_b
    share_f = launches_f / total if total else 0.5
    return exposed * share_f, exposed * (1.0 - share_f)
