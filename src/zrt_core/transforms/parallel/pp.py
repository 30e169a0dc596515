"""Pipeline parallelism: cutting a graph into stages and the bytes that cross a stage boundary."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attrs import evolve, field, frozen

from zrt_core.errors import LayoutError
from zrt_core.ir.graph import (
    OpGraph,
    Phase,
    TensorMeta,
)
from zrt_core.transforms.parallel.sharding import collective

if TYPE_CHECKING:
    from zrt_core.strategy import Parallel
    from zrt_core.transforms.base import TransformContext


# -- pipeline stages ---------------------------------------------------------------------


@frozen
class Stage:
    """One (virtual) pipeline stage: the layer indices it holds and whether it holds the
    embedding (first) and the head (last); ``rank`` is the pipeline rank running it."""

    index: int
    rank: int
    layers: tuple[int, ...] = field(converter=tuple)
    embedding: bool
    head: bool

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "rank": self.rank, "layers": [self.layers[0],
                self.layers[-1]] if self.layers else [], "embedding": self.embedding,
                "head": self.head}


@frozen
class PipelinePlan:
    """Contiguous layer ranges per virtual stage (``pp × vp`` of them, stage ``v`` on rank
    ``v mod pp``), embedding on the first, head on the last."""

    pp: int
    vp: int
    stages: tuple[Stage, ...] = field(converter=tuple)

    @classmethod
    def build(cls, num_layers: int, pp: int, vp: int = 1) -> PipelinePlan:
        n = pp * vp
        if num_layers % n:
            raise LayoutError(
                f"pp × vp = {pp} × {vp} = {n} does not divide the {num_layers} layers",
                "choose pp and vp so that layers split evenly into stages")
        per = num_layers // n
        stages = tuple(Stage(index=v, rank=v % pp, layers=tuple(range(v * per, (v + 1) * per)),
                             embedding=v == 0, head=v == n - 1) for v in range(n))
        return cls(pp=pp, vp=vp, stages=stages)

    def layer_counts(self, graph: OpGraph) -> list[dict[str, int]]:
        """Per stage, how many layers of each template kind it runs."""
        return [{t.kind: t.count_in(s.layers) for t in graph.templates.values()
                 if t.count_in(s.layers)} for s in self.stages]

    def to_json(self) -> dict[str, Any]:
        return {"pp": self.pp, "vp": self.vp, "stages": [s.to_json() for s in self.stages]}


class PipelineStages:
    """Records the stage plan in ``meta["pp_plan"]``; :func:`stage_graph` cuts a stage out
    with its boundary send/recv."""

    name = "pp"

    def apply(self, graph: OpGraph, ctx: TransformContext) -> OpGraph:
        p = ctx.parallel
        layers = ctx.dims.layers if ctx.dims is not None else int(graph.meta.get(
            "num_layers", 0))
        plan = PipelinePlan.build(layers, p.pp, p.vp)
        return evolve(graph, meta={**graph.meta, "pp_plan": plan.to_json()})


def boundary_bytes(graph: OpGraph) -> int:
    """Bytes one rank sends at a stage boundary: the hidden states of its tokens as they
    leave a layer (B × S × H / cp, / tp with SP), read from the graph's per-rank shapes."""
    layer_nodes = [n for n in graph.nodes if n.layer_index is not None]
    if not layer_nodes:
        return 0
    first_layer = layer_nodes[0].layer_index
    produced_in_layer = {t.tensor_id for n in graph.nodes if n.layer_index == first_layer
                         for t in n.outputs}
    # the residual stream entering the first layer: an input of it produced outside
    for n in graph.nodes:
        if n.layer_index != first_layer:
            continue
        for t in n.inputs:
            if (t.tensor_id is not None and t.param is None and t.tensor_id not in
                    produced_in_layer and len(t.shape) >= 2 and t.dtype.startswith(
                        ("bfloat", "float"))):
                return t.nbytes
    return 0


def stage_graph(graph: OpGraph, plan: PipelinePlan, stage: int, parallel: Parallel
                ) -> OpGraph:
    """The part of ``graph`` one pipeline stage runs, with a ``send_recv`` receiving the
    hidden states first (not on the first stage) and one sending them last (not on the
    last stage). Templates keep only the stage's layers."""
    st = plan.stages[stage]
    wanted = set(st.layers)
    layer_positions = [i for i, n in enumerate(graph.nodes) if n.layer_index is not None]
    first = layer_positions[0] if layer_positions else len(graph.nodes)
    last = layer_positions[-1] if layer_positions else -1
    backward = graph.phase == Phase.TRAIN_BACKWARD
    templates = []
    relabel: dict[int, int] = {}
    for rep, t in graph.templates.items():
        kept = tuple(i for i in t.indices if i in wanted)
        if kept:
            templates.append(evolve(t, representative=kept[0], indices=kept))
            relabel[rep] = kept[0]
    nodes = []
    for i, n in enumerate(graph.nodes):
        if n.layer_index is not None:
            if n.layer_index in relabel:
                nodes.append(evolve(n, layer_index=relabel[n.layer_index]))
            continue
        before = i < first
        after = i > last
        embedding_side = before if not backward else after
        head_side = after if not backward else before
        if (embedding_side and st.embedding) or (head_side and st.head) or \
                (not before and not after and relabel):
            nodes.append(n)
    nbytes = boundary_bytes(graph)
    next_id = max((n.id for n in graph.nodes), default=0) + 1
    like = nodes[0] if nodes else graph.nodes[0]
    hidden = TensorMeta(shape=(max(nbytes // 2, 1),), dtype="bfloat16")
    plain_like = evolve(like, layer_index=None, layer_kind=None, module_path="pipeline",
                        module_class="")
    recv_needed = (st.index > 0) if not backward else (st.index < len(plan.stages) - 1)
    send_needed = (st.index < len(plan.stages) - 1) if not backward else (st.index > 0)
    if recv_needed:
        nodes.insert(0, collective(next_id, "send_recv", "pp", parallel, nbytes, [hidden],
                                   [hidden], plain_like, direction="recv", stage=st.index))
        next_id += 1
    if send_needed:
        nodes.append(collective(next_id, "send_recv", "pp", parallel, nbytes, [hidden],
                                [hidden], plain_like, direction="send", stage=st.index))
    meta = {**graph.meta, "pp_stage": st.to_json()}
    return OpGraph(phase=graph.phase, nodes=nodes,
                   edges=[(a, b) for a, b in graph.edges if a in {n.id for n in nodes}
                          and b in {n.id for n in nodes}],
                   templates=templates, meta=meta)
