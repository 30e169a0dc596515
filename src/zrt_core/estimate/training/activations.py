"""Activation and transient memory: the forward tensors the backward keeps, and the backward's
peak of transient buffers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zrt_core.ir.graph import (
    Category,
    OpGraph,
    OpNode,
    dtype_bytes,
)

if TYPE_CHECKING:
    pass


# -- activations and transient memory --------------------------------------------------------


_RANDOM_OPS = ("bernoulli", "rand", "dropout", "normal", "uniform")

#: Backward ops whose input at this position is no saved activation in Megatron-Core: since
#: core 0.13 ("Memory efficient token permutation", Megatron-LM 2659630721) the router
#: probabilities multiply the experts' activation (``weighted_bias_swiglu_impl``,
#: ``weighted_bias_quick_geglu_impl`` or ``activation * permuted_probs`` in
#: ``TEGroupedMLP.forward``) and the un-permutation is unweighted, so no expert output
#: ``[tokens × top-k, hidden]`` is kept for the probabilities' gradient: the activation's
#: backward computes it from the fc1 output it keeps anyway. The captured graph weighs in
#: the combine (as Hugging Face does), whose backward reads the expert output.
_NOT_SAVED_INPUTS = {"zrt.moe_combine_backward": 1}


def _kernel_inputs(forward: OpGraph, internal: set[int]) -> dict[int, list[Any]]:
    """Internal tensor id → the activation inputs of the fused forward kernel that made it:
    what its backward recomputes the internal tensor from, so what it keeps (Megatron's fused
    ``bias_swiglu`` and TE's fused norms save their inputs). Parameters, and tensors drawn
    from parameters alone (a per-row gather of an expert bias, a weight's cast), are no
    activations."""
    producer: dict[int, OpNode] = {}
    for n in forward.nodes:
        for t in n.outputs:
            if t.tensor_id is not None:
                producer[t.tensor_id] = n

    def from_params(t: Any) -> bool:
        p = producer.get(t.tensor_id)
        return p is not None and _param_gather(p)

    out: dict[int, list[Any]] = {}
    for n in forward.nodes:
        if not n.fused_from:
            continue
        made = {t.tensor_id for m in n.members for t in m.outputs} & internal
        if not made:
            continue
        kept = [t for t in n.inputs if t.tensor_id is not None and t.param is None
                and t.tensor_id not in internal and not from_params(t)]
        for tid in made:
            out[tid] = kept
    return out


def _split_conv1d_scans(forward: OpGraph, base: dict[int, int]) -> dict[int, list[Any]]:
    """Megatron-Core's Mamba-2 mixer in training (``use_mamba_mem_eff_path``, on by default):
    the depthwise ``conv1d``, its activation and the SSD chunk scan run as one autograd
    function (mamba_ssm's ``mamba_split_conv1d_scan_combined``, ``MambaMixer._ssm_training``)
    that keeps the in-projection output and re-runs the convolution and its activation in
    its backward, "which reduces the size of forward activations stored for backprop". The
    tensors made between a Mamba mixer's convolution and its scan (``zrt.ssd_chunk_scan``:
    the convolution and activation outputs, the scan's x, B, C) → the convolution's activation
    input, kept instead."""
    producer: dict[int, OpNode] = {}
    for n in forward.nodes:
        for t in n.outputs:
            if t.tensor_id is not None:
                producer.setdefault(t.tensor_id, n)
    out: dict[int, list[Any]] = {}
    for scan in forward.nodes:
        if not scan.op.startswith("zrt.ssd_chunk_scan") or scan.op.startswith(
                "zrt.ssd_chunk_scan_backward"):
            continue
        # walk back from the scan's inputs through the mixer's own ops to its convolution
        chain: list[OpNode] = []
        convs: list[OpNode] = []
        todo = [producer[t.tensor_id] for t in scan.inputs
                if t.tensor_id is not None and t.tensor_id in producer]
        seen: set[int] = set()
        while todo:
            n = todo.pop()
            if n.id in seen or n.module_path != scan.module_path \
                    or n.layer_index != scan.layer_index:
                continue
            seen.add(n.id)
            if "convolution" in n.op:
                convs.append(n)
                chain.append(n)
                continue
            if n.category == Category.MATMUL:
                continue
            chain.append(n)
            todo.extend(producer[t.tensor_id] for t in n.inputs
                        if t.tensor_id is not None and t.tensor_id in producer)
        if len(convs) != 1:
            continue
        conv = convs[0]
        kept = [t for t in conv.inputs[:1] if t.tensor_id is not None and t.param is None]
        after_conv = {conv.id}
        for n in forward.nodes:  # the chain's nodes downstream of the convolution
            if n.id in seen and n.id not in after_conv and any(
                    producer.get(t.tensor_id) is not None
                    and producer[t.tensor_id].id in after_conv for t in n.inputs
                    if t.tensor_id is not None):
                after_conv.add(n.id)
        for n in chain:
            if n.id not in after_conv:
                continue
            for t in n.outputs:
                if t.tensor_id is not None:
                    out[base.get(t.tensor_id, t.tensor_id)] = kept
    return out


def _param_gather(node: OpNode) -> bool:
    """Rows of a parameter picked by indices (``bias[expert_ids]``: the HF MoE models' per-row
    expert bias), not an embedding lookup: no activation, the backward indexes again."""
    if node.category in (Category.MATMUL, Category.ATTENTION, Category.EMBEDDING):
        return False
    if not any(k in node.op for k in ("index", "gather")):
        return False
    floats = [i for i in node.inputs if not _is_index(i)]
    return bool(floats) and all(i.param is not None for i in floats)


def _is_index(t: Any) -> bool:
    return str(t.dtype).startswith(("int", "uint", "bool", "torch.int", "torch.bool"))


def _forward_tensors(forward: OpGraph) -> tuple[dict[int, int], dict[int, Any], set[int]]:
    """What the forward graph says about its tensors: view → the storage it views (views of
    views followed, inside fused nodes too), storage id → its metadata, and the tensors a
    fused kernel recomputes in its backward instead of keeping.

    Recomputed: what a fused kernel produces internally (neither a view nor one of its
    outputs), and the outputs of a fused elementwise kernel that no other forward node
    reads (kept only for its backward: a fused bias-GeLU's backward recomputes tanh from
    the GEMM output, Megatron's ``bias_gelu``) — unless the kernel draws random numbers (a
    dropout mask must be kept).
    """
    base: dict[int, int] = {}
    meta: dict[int, Any] = {}
    internal: set[int] = set()
    read: set[int] = set()
    for n in forward.nodes:
        for t in n.inputs:
            if t.tensor_id is not None:
                read.add(t.tensor_id)
    for n in forward.nodes:
        boundary = {t.tensor_id for t in n.outputs}
        members = n.members
        fused = bool(n.fused_from)
        random = fused and any(any(r in m.op for r in _RANDOM_OPS) for m in members)
        for m in members:
            view = m.category == Category.VIEW
            src = m.inputs[0].tensor_id if m.inputs else None
            for t in m.outputs:
                tid = t.tensor_id
                if tid is None:
                    continue
                if view and src is not None:
                    base[tid] = base.get(src, src)
                elif tid not in meta:
                    meta[tid] = t
                    if fused and not random and tid not in boundary:
                        internal.add(tid)
        if fused and not random and n.category == Category.ELEMENTWISE:
            for t in n.outputs:
                if t.tensor_id is not None and t.tensor_id not in read:
                    internal.add(t.tensor_id)
    # a view of a recomputed tensor is recomputed with it
    for tid, root in base.items():
        if root in internal:
            internal.add(tid)
    return base, meta, internal


def saved_activation_bytes(forward: OpGraph, backward: OpGraph) -> dict[int | str, float]:
    """Bytes one micro-batch keeps from forward to backward, per layer template (key: its
    representative, one layer's worth) and outside the layers (``"embedding"`` and
    ``"head"`` sides).

    A saved activation is a tensor a backward node reads that no backward node produced
    and that is not a weight: capture shares tensor ids between the two phases
    (docs/architecture.md). Views count once, as the storage they view; a tensor saved in
    two dtypes (the bf16 original and an fp8 copy for a weight-gradient GEMM) counts both.
    A tensor a fused forward kernel produces internally is not kept: the fused backward
    kernel recomputes it from the fused kernel's inputs (Megatron's fused bias-GeLU keeps
    the GEMM output only). Under recompute the backward reads re-computed tensors, so only
    the checkpoints remain. The MoE combine's backward keeps no expert output (Megatron-Core
    weighs the experts' activation by the router probabilities: :data:`_NOT_SAVED_INPUTS`).
    A Mamba-2 mixer keeps its convolution's input, not what the convolution, its activation
    and the scan make of it (:func:`_split_conv1d_scans`).
    """
    base, meta, internal = _forward_tensors(forward)
    kernel_inputs = _kernel_inputs(forward, internal)
    recomputed_by_scan = _split_conv1d_scans(forward, base)
    internal = internal | set(recomputed_by_scan)
    kernel_inputs.update(recomputed_by_scan)
    gathered = {t.tensor_id for n in forward.nodes if _param_gather(n) for t in n.outputs}
    # what a backward node or a fused member makes; a recompute copy renames its members'
    # tensors too, so the backward from the copy on reads them there, nothing original
    produced = {t.tensor_id for n in backward.nodes for m in n.members for t in m.outputs
                if t.tensor_id is not None}
    first_layer = next((i for i, n in enumerate(backward.nodes)
                        if n.layer_index is not None), len(backward.nodes))
    seen: dict[int, tuple[int | str, set[str], int]] = {}
    for pos, n in enumerate(backward.nodes):
        key: int | str
        if n.layer_index is not None:
            key = n.layer_index
        else:
            key = "head" if pos < first_layer else "embedding"
        skip = _NOT_SAVED_INPUTS.get(n.op.rsplit(".", 1)[0] if n.op.count(".") > 1
                                     else n.op, -1)
        reads = list(enumerate(n.inputs))
        for pos_in, t in reads:
            tid = t.tensor_id
            if tid is None or t.param is not None or tid in produced or pos_in == skip:
                continue
            root = base.get(tid, tid)
            if root in gathered:
                continue
            if root in internal:
                # the fused kernel's backward recomputes it from the kernel's inputs: those
                # are kept instead
                reads.extend((-2, i) for i in kernel_inputs.get(root, ())
                             if base.get(i.tensor_id, i.tensor_id) not in seen)
                continue
            entry = seen.get(root)
            if entry is None:
                stored = meta.get(root)
                numel = stored.numel if stored is not None else t.numel
                seen[root] = (key, {stored.dtype if stored is not None and t.dtype ==
                                    stored.dtype else t.dtype}, numel)
            else:
                entry[1].add(t.dtype)
    out: dict[int | str, float] = {}
    for key, dtypes, numel in seen.values():
        out[key] = out.get(key, 0.0) + sum(numel * dtype_bytes(d) for d in dtypes)
    return out


def transient_bytes(backward: OpGraph) -> dict[int | str, float]:
    """Peak bytes of tensors a backward segment creates and frees while it runs (liveness
    over the segment's nodes in order: outputs allocated, freed after their last reader),
    per layer template and for the outer head / embedding segments."""
    segments: dict[int | str, list[OpNode]] = {}
    first_layer = next((i for i, n in enumerate(backward.nodes)
                        if n.layer_index is not None), len(backward.nodes))
    for pos, n in enumerate(backward.nodes):
        key: int | str = n.layer_index if n.layer_index is not None else (
            "head" if pos < first_layer else "embedding")
        segments.setdefault(key, []).append(n)
    out: dict[int | str, float] = {}
    for key, nodes in segments.items():
        last_use: dict[int, int] = {}
        for i, n in enumerate(nodes):
            for t in n.inputs:
                if t.tensor_id is not None:
                    last_use[t.tensor_id] = i
        live = 0.0
        peak = 0.0
        sizes: dict[int, float] = {}
        for i, n in enumerate(nodes):
            if not (n.zero_cost or n.category in (Category.VIEW, Category.COLLECTIVE)):
                for t in n.outputs:
                    if t.tensor_id is not None and not t.is_view and t.tensor_id not in sizes:
                        sizes[t.tensor_id] = t.nbytes
                        live += t.nbytes
            peak = max(peak, live)
            for t in (*n.inputs, *n.outputs):
                tid = t.tensor_id
                if tid in sizes and last_use.get(tid, -1) <= i:
                    live -= sizes.pop(tid)
        out[key] = peak
    return out
