"""Activation recomputation: the forward nodes a backward runs again (full, selective or
per-module), with their overlap hints.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from attrs import evolve, frozen

from zrt_core.errors import SpecError
from zrt_core.ir.graph import (
    Category,
    OpGraph,
    OpNode,
    Phase,
    TensorMeta,
)
from zrt_core.transforms.training.attention import CORE_ATTENTION_ATTR
from zrt_core.transforms.training.common import RECOMPUTE_ATTR, _next_id, _tensor_ids

if TYPE_CHECKING:
    from zrt_core.schedule.scheduler import OverlapRules
    from zrt_core.transforms.base import TransformContext


# -- recompute ------------------------------------------------------------------------------------


@frozen
class Recompute:
    """Activation recomputation, as Megatron-LM runs it.

    - ``none``: nothing changes.
    - ``selective`` (``--recompute-granularity selective``, Korthikanti et al. 2022): the
      attention core (the fused attention kernel) is re-run in the backward, just before its
      own backward; its internal outputs (the softmax statistics) are not kept.
    - ``full`` (``--recompute-granularity full --recompute-method uniform
      --recompute-num-layers 1``): only each layer's input is kept; the whole layer forward,
      its TP/SP/EP communication included, re-runs just before that layer's backward.

    Re-run nodes are copies of the forward nodes (phase ``train_backward``,
    ``attrs["recompute"] = True``, new node and tensor ids); the backward nodes of the layer
    read the re-computed tensors instead of saved ones, which is how the memory model sees
    what is no longer kept. A copied collective keeps how the forward runs it (its
    ``attrs["overlap"]``), since a recomputed forward blocks like a forward.

    :param forward: the ``train_forward`` graph the backward came from.
    :param rules: overlap rules, to pin how copied collectives run.
    """

    mode: str
    forward: OpGraph
    rules: OverlapRules | None = None
    name: str = "recompute"

    def apply(self, graph: OpGraph, ctx: TransformContext) -> OpGraph:
        if graph.phase != Phase.TRAIN_BACKWARD:
            raise SpecError(f"recompute applies to the train_backward graph, not {graph.phase}")
        if self.mode == "none":
            return graph
        if self.mode not in ("selective", "full"):
            raise SpecError(f"unknown recompute mode {self.mode!r}",
                            "use none, selective or full")
        fwd_by_layer: dict[int, list[OpNode]] = {}
        for n in self.forward.nodes:
            if n.layer_index is not None:
                fwd_by_layer.setdefault(n.layer_index, []).append(n)
        node_offset = _next_id(graph)
        tensor_offset = _tensor_ids((graph, self.forward))
        copies: dict[int, list[OpNode]] = {}  # backward node id -> copies inserted before it
        renamed: dict[int, int] = {}  # forward tensor id -> recomputed tensor id
        new_edges: list[tuple[int, int]] = []
        fwd_edges = self.forward.edges

        if self.mode == "full":
            first_bwd: dict[int, int] = {}
            for n in graph.nodes:
                if n.layer_index is not None and n.layer_index not in first_bwd:
                    first_bwd[n.layer_index] = n.id
            for layer, nodes in fwd_by_layer.items():
                if layer not in first_bwd:
                    continue
                made = self._copy(nodes, node_offset, tensor_offset, renamed)
                node_offset += len(made)
                copies.setdefault(first_bwd[layer], []).extend(made)
                new_edges.extend(_copied_edges(nodes, made, fwd_edges))
                new_edges.append((made[-1].id, first_bwd[layer]))
        else:  # selective: the attention core
            for nodes in fwd_by_layer.values():
                groups = _attention_cores(nodes)
                for core in groups:
                    seq = next((c.attrs.get("seq_nr") for c in reversed(core)
                                if c.attrs.get("seq_nr") is not None), None)
                    target = next((n for n in graph.nodes if n.layer_index is not None and
                                   n.attrs.get("fwd_seq_nr") == seq and
                                   (n.category == Category.ATTENTION or
                                    n.attrs.get(CORE_ATTENTION_ATTR))), None)
                    if target is None:
                        continue
                    made = self._copy(core, node_offset, tensor_offset, renamed)
                    node_offset += len(made)
                    copies.setdefault(target.id, []).extend(made)
                    new_edges.extend(_copied_edges(core, made, fwd_edges))
                    new_edges.append((made[-1].id, target.id))

        out: list[OpNode] = []
        recompute_ids = {c.id for cs in copies.values() for c in cs}
        for n in graph.nodes:
            out.extend(copies.get(n.id, ()))
            out.append(_rename_inputs(n, renamed) if n.layer_index is not None else n)
        edges = [*graph.edges, *new_edges]
        meta = {**graph.meta, "recompute": self.mode}
        result = evolve(graph.with_nodes(out, edges), meta=meta)
        assert len(recompute_ids) == sum(len(c) for c in copies.values())
        return result

    def _copy(self, nodes: Sequence[OpNode], node_offset: int, tensor_offset: int,
              renamed: dict[int, int]) -> list[OpNode]:
        made = []
        for i, n in enumerate(nodes):
            for t in n.outputs:
                if t.tensor_id is not None and t.param is None:
                    renamed[t.tensor_id] = t.tensor_id + tensor_offset
            attrs = {k: v for k, v in n.attrs.items() if k != "seq_nr"}
            attrs[RECOMPUTE_ATTR] = True
            if "seq_nr" in n.attrs:
                attrs["fwd_seq_nr"] = n.attrs["seq_nr"]
            if n.category == Category.COLLECTIVE and "overlap" not in attrs:
                attrs["overlap"] = _forward_hint(n, self.rules)
            made.append(evolve(
                n, id=node_offset + i, phase=Phase.TRAIN_BACKWARD, attrs=attrs,
                inputs=tuple(_renamed(t, renamed) for t in n.inputs),
                outputs=tuple(_renamed(t, renamed) for t in n.outputs)))
        return made


def _attention_cores(nodes: Sequence[OpNode]) -> list[list[OpNode]]:
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


def _forward_hint(node: OpNode, rules: OverlapRules | None) -> str:
    """The ``attrs["overlap"]`` that makes a recomputed collective run as in the forward."""
    from zrt_core.schedule.scheduler import OverlapRules
    from zrt_core.schedule.timeline import ASYNC, PIPELINED

    plan = (rules or OverlapRules()).plan(node)
    if plan.mode == PIPELINED:
        return plan.side
    if plan.mode == ASYNC:
        return "async"
    return "none"


def _renamed(t: TensorMeta, renamed: Mapping[int, int]) -> TensorMeta:
    new = renamed.get(t.tensor_id) if t.tensor_id is not None else None
    return evolve(t, tensor_id=new) if new is not None else t


def _rename_inputs(n: OpNode, renamed: Mapping[int, int]) -> OpNode:
    if not renamed or not any(t.tensor_id in renamed for t in n.inputs):
        return n
    return evolve(n, inputs=tuple(_renamed(t, renamed) for t in n.inputs))


def _copied_edges(originals: Sequence[OpNode], copies: Sequence[OpNode],
                  edges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    mapping = {o.id: c.id for o, c in zip(originals, copies, strict=True)}
    return [(mapping[a], mapping[b]) for a, b in edges if a in mapping and b in mapping]
