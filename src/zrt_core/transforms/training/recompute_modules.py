"""Megatron-Core's selective-recompute modules (``recompute_modules``): which forward nodes of a
layer each module re-runs in the backward, found from the graph's data flow and module paths.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from zrt_core.ir.graph import Category, OpNode
from zrt_core.strategy import RECOMPUTE_MODULES
from zrt_core.transforms.training.attention import CORE_ATTENTION_ATTR

__all__ = ["RECOMPUTE_MODULES", "module_regions"]
#: Megatron-Core's default list under ``recompute_granularity="selective"``.
DEFAULT_MODULES = ("core_attn",)
#: Ordinary checkpoints (``tensor_parallel.checkpoint``): inputs kept, the whole function,
#: collectives included, re-runs when the backward reaches it; its output stays saved where
#: a later op keeps it.
FULL_CHECKPOINT = ("core_attn", "mlp", "moe", "shared_experts")
#: ``CheckpointWithoutOutput``: the output is freed after its consumer ran and the small
#: function re-runs just before a backward op first reads it.
OUTPUT_DISCARDING = ("mla_up_proj", "layernorm", "moe_act")
#: Modules Megatron-Core refuses on a model without the part they name (``__post_init__``:
#: ``moe_act`` needs ``moe_grouped_gemm``, ``mla_up_proj`` needs ``multi_latent_attention``).
NEEDS = {"moe_act": "MoE experts", "mla_up_proj": "multi-latent attention (MLA)"}

_MOE_CATEGORIES = (Category.MOE_ROUTER, Category.MOE_DISPATCH, Category.MOE_COMBINE)


def _under(path: str, prefix: str) -> bool:
    if not prefix:
        return True
    return path == prefix or path.startswith(prefix + ".")


def _common_prefix(paths: Iterable[str]) -> str:
    parts: list[str] | None = None
    for p in paths:
        if not p:
            continue
        comps = p.split(".")
        if parts is None:
            parts = comps
            continue
        i = 0
        while i < min(len(parts), len(comps)) and parts[i] == comps[i]:
            i += 1
        parts = parts[:i]
    return ".".join(parts or ())


class LayerFlow:
    """One layer's forward nodes with their in-layer data flow (tensor producers/readers)."""

    def __init__(self, nodes: Sequence[OpNode]) -> None:
        self.nodes = list(nodes)
        self.pos = {n.id: i for i, n in enumerate(self.nodes)}
        self.producer: dict[int, OpNode] = {}
        for n in self.nodes:
            for t in n.outputs:
                if t.tensor_id is not None and t.tensor_id not in self.producer:
                    self.producer[t.tensor_id] = n
        self.readers: dict[int, list[OpNode]] = {}
        for n in self.nodes:
            for t in n.inputs:
                if t.tensor_id is not None and t.param is None:
                    self.readers.setdefault(t.tensor_id, []).append(n)
        self.prefix = _common_prefix(n.module_path for n in self.nodes)
        moe = [n.module_path for n in self.nodes if n.category in _MOE_CATEGORIES]
        self.moe_prefix = _common_prefix(moe) if moe else None

    def parents(self, n: OpNode) -> list[OpNode]:
        out = []
        for t in n.inputs:
            p = self.producer.get(t.tensor_id) if t.tensor_id is not None else None
            if p is not None and p.id != n.id and self.pos[p.id] < self.pos[n.id]:
                out.append(p)
        return out

    def children(self, n: OpNode) -> list[OpNode]:
        out = []
        for t in n.outputs:
            for r in self.readers.get(t.tensor_id, ()) if t.tensor_id is not None else ():
                if r.id != n.id and self.pos[r.id] > self.pos[n.id]:
                    out.append(r)
        return out

    def ancestors(self, start: Iterable[OpNode]) -> set[int]:
        """Ids of the nodes ``start`` depends on (not ``start`` itself)."""
        seen: set[int] = set()
        todo = [p for n in start for p in self.parents(n)]
        while todo:
            n = todo.pop()
            if n.id in seen:
                continue
            seen.add(n.id)
            todo.extend(self.parents(n))
        return seen

    def descendants(self, start: Iterable[OpNode]) -> set[int]:
        """Ids of the nodes that depend on ``start`` (not ``start`` itself)."""
        seen: set[int] = set()
        todo = [c for n in start for c in self.children(n)]
        while todo:
            n = todo.pop()
            if n.id in seen:
                continue
            seen.add(n.id)
            todo.extend(self.children(n))
        return seen

    def ordered(self, ids: Iterable[int]) -> list[OpNode]:
        keep = set(ids)
        return [n for n in self.nodes if n.id in keep]

    def with_views(self, region: list[OpNode]) -> list[OpNode]:
        """``region`` and the views of its outputs (zero-cost aliases a later op may save)."""
        ids = {n.id for n in region}
        changed = True
        while changed:
            changed = False
            for n in self.nodes:
                if n.id in ids or n.category != Category.VIEW or not n.inputs:
                    continue
                p = self.producer.get(n.inputs[0].tensor_id)
                if p is not None and p.id in ids:
                    ids.add(n.id)
                    changed = True
        return self.ordered(ids)


def attention_cores(nodes: Sequence[OpNode]) -> list[list[OpNode]]:
    """The attention cores among a layer's forward nodes: each fused attention node, or each
    run of nodes marked ``core_attention`` (:class:`UnfusedAttention`)."""
    cores: list[list[OpNode]] = []
    run: list[OpNode] = []
    for n in nodes:
        if n.attrs.get(CORE_ATTENTION_ATTR):
            run.append(n)
            continue
        if run:
            cores.append(run)
            run = []
        if n.category == Category.ATTENTION:
            cores.append([n])
    if run:
        cores.append(run)
    return cores


def module_regions(module: str, layer: LayerFlow) -> list[list[OpNode]]:
    """The forward nodes (in order) ``module`` re-runs in one layer, one list per instance;
    empty where the layer has no such part (Megatron skips it there)."""
    if module == "core_attn":
        return attention_cores(layer.nodes)
    if module == "mla_up_proj":
        return [r for r in (_mla_up_proj(layer, c) for c in attention_cores(layer.nodes)) if r]
    if module == "layernorm":
        return [layer.with_views([n]) for n in _pre_moe_norms(layer)]
    if module == "moe_act":
        r = _moe_act(layer)
        return [r] if r else []
    if module == "moe":
        if layer.moe_prefix is None:
            return []
        return [[n for n in layer.nodes if _under(n.module_path, layer.moe_prefix)]]
    if module == "shared_experts":
        if layer.moe_prefix is None:
            return []
        depth = len(layer.moe_prefix.split("."))
        r = [n for n in layer.nodes if _under(n.module_path, layer.moe_prefix)
             and len(n.module_path.split(".")) > depth
             and n.module_path.split(".")[depth].startswith("shared_expert")]
        return [r] if r else []
    if module == "mlp":
        r = _dense_mlp(layer)
        return [r] if r else []
    raise ValueError(module)  # callers check names against RECOMPUTE_MODULES


def _mla_up_proj(layer: LayerFlow, core: list[OpNode]) -> list[OpNode]:
    """``qkv_up_proj_and_rope_apply``: from the latents (the outputs of the first-level
    down-projection GEMMs) to the core attention's inputs — the q/kv latent norms TE fuses
    into the up-projections, the up-projection GEMMs with their sequence-parallel gathers,
    RoPE and the concatenation. Empty unless an up-projection GEMM exists (not MLA).
    GEMMs are read inside the attention module only: a GEMM ahead of it (a hyper-connection
    mixer) does not make the attention's down-projections "up" ones."""
    anc = layer.ancestors(core)
    attn = _common_prefix(n.module_path for n in core)
    matmuls = [n for n in layer.ordered(anc)
               if n.category == Category.MATMUL and _under(n.module_path, attn)]
    first = [m for m in matmuls
             if not any(layer.nodes[layer.pos[a]].category == Category.MATMUL
                        and _under(layer.nodes[layer.pos[a]].module_path, attn)
                        for a in layer.ancestors([m]))]
    if len(first) == len(matmuls):
        return []
    before = layer.ancestors(first) | {m.id for m in first}
    return layer.ordered(i for i in anc if i not in before)


def _pre_moe_norms(layer: LayerFlow) -> list[OpNode]:
    """The pre-MLP norm of a MoE layer: a separate module in Megatron's MoE layer spec (the
    dense MLP's and the attention's norms are fused into TE's LayerNorm-linear modules)."""
    if layer.moe_prefix is None:
        return []
    out = []
    for n in layer.nodes:
        if n.category != Category.NORM or _under(n.module_path, layer.moe_prefix):
            continue
        region = layer.with_views([n])
        ids = {r.id for r in region}
        if any(_under(c.module_path, layer.moe_prefix)
               for r in region for c in layer.children(r) if c.id not in ids):
            out.append(n)
    return out


def _moe_act(layer: LayerFlow) -> list[OpNode]:
    """Between the grouped expert FC1 and FC2 (``bias_act_func``, the one function
    ``TEGroupedMLP.forward`` wraps in ``CheckpointWithoutOutput`` under ``moe_act``): the
    activation and what feeds FC2 from it; no GEMM. FC1: the matmuls under the MoE module
    fed by the token dispatch with no such matmul before them; FC2: those whose only such
    matmuls upstream are FC1. A GEMM after the combine (a latent MoE's ``fc2_latent_proj``)
    is neither, so the combine and its all-to-all stay out of the region."""
    if layer.moe_prefix is None:
        return []
    dispatch = [n for n in layer.nodes if n.category == Category.MOE_DISPATCH]
    after = layer.descendants(dispatch)
    experts = [n for n in layer.ordered(after) if n.category == Category.MATMUL
               and _under(n.module_path, layer.moe_prefix)]
    ids = {n.id for n in experts}
    upstream = {n.id: layer.ancestors([n]) & ids for n in experts}
    fc1 = [n for n in experts if not upstream[n.id]]
    fc1_ids = {n.id for n in fc1}
    fc2 = [n for n in experts if upstream[n.id] and upstream[n.id] <= fc1_ids]
    if not fc1 or not fc2:
        return []
    between = layer.descendants(fc1) & layer.ancestors(fc2)
    return layer.ordered(i for i in between
                         if layer.nodes[layer.pos[i]].category != Category.MATMUL)


def _dense_mlp(layer: LayerFlow) -> list[OpNode]:
    """A dense layer's MLP with the norm TE fuses into its FC1 (``TELayerNormColumnParallel
    Linear``) and its TP collectives; nothing on a MoE layer (``if not self.is_moe_layer``)."""
    if layer.moe_prefix is not None:
        return []
    depth = len(layer.prefix.split(".")) if layer.prefix else 0
    children: dict[str, list[OpNode]] = {}
    for n in layer.nodes:
        comps = n.module_path.split(".")
        if len(comps) > depth and _under(n.module_path, layer.prefix):
            children.setdefault(".".join(comps[:depth + 1]), []).append(n)
    mlp = [path for path, ns in children.items()
           if any(n.category == Category.MATMUL for n in ns)
           and not any(n.category in (Category.ATTENTION, Category.SSM)
                       or n.attrs.get(CORE_ATTENTION_ATTR) for n in ns)]
    if len(mlp) != 1:
        return []
    body = children[mlp[0]]
    ids = {n.id for n in body}
    for n in layer.nodes:
        if n.category == Category.NORM and n.id not in ids:
            region = layer.with_views([n])
            if any(c.id in ids for r in region for c in layer.children(r)):
                ids.update(r.id for r in region)
    return layer.ordered(ids)
