"""Layer templates of a training capture: the forward/backward split into the layers a
pipeline stage holds, and multi-token-prediction layers added to them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from attrs import evolve

from zrt_core.errors import SpecError
from zrt_core.ir.graph import (
    LayerTemplate,
    OpGraph,
    OpNode,
    Phase,
    TensorMeta,
)
from zrt_core.transforms.training.common import _next_id, _tensor_ids

if TYPE_CHECKING:
    pass


# -- layer templates --------------------------------------------------------------------------

#: Added to the autograd sequence numbers of a copied layer, so the copy's backward nodes pair
#: with its own forward nodes (weight-gradient marks, selective recompute).
_SEQ_OFFSET = 10_000_000


def split_layer_templates(forward: OpGraph, backward: OpGraph, subset: Iterable[int]
                          ) -> tuple[OpGraph, OpGraph]:
    """Give the layers of ``subset`` templates of their own where they share one with layers
    outside it (the last layers kept in bf16 under an fp4 recipe, say), in both phases.

    A template whose indices fall on both sides keeps its representative's side; the other
    side gets a copy of the representative's nodes right after them, with the smallest of
    its indices as the representative: fresh node ids, fresh ids for every tensor the layer
    produces (shared between the phases, so the backward reads the copy's saved
    activations), parameter names suffixed ``@<representative>`` (they are other layers'
    weights), and autograd sequence numbers offset by :data:`_SEQ_OFFSET`. The counts add
    up: every layer is still run once, by exactly one template.
    """
    wanted = set(subset)
    moves: dict[int, tuple[int, tuple[int, ...], tuple[int, ...]]] = {}
    for rep, t in forward.templates.items():
        inside = tuple(i for i in t.indices if i in wanted)
        outside = tuple(i for i in t.indices if i not in wanted)
        if not inside or not outside:
            continue
        keep, other = (inside, outside) if rep in inside else (outside, inside)
        moves[rep] = (min(other), keep, other)
    if not moves:
        return forward, backward
    offset = _tensor_ids((forward, backward))
    renamed: dict[tuple[int, int], int] = {}  # (representative, tensor id) -> copy's id
    for g in (forward, backward):
        for n in g.nodes:
            if n.layer_index in moves:
                for t in (t for m in (n, *n.fused_from) for t in m.outputs):
                    if t.tensor_id is not None and t.param is None:
                        key = (n.layer_index, t.tensor_id)
                        if key not in renamed:
                            renamed[key] = offset + len(renamed)

    def copy_tensor(t: TensorMeta, rep: int, new_rep: int) -> TensorMeta:
        changes: dict[str, Any] = {}
        if t.tensor_id is not None and (rep, t.tensor_id) in renamed:
            changes["tensor_id"] = renamed[(rep, t.tensor_id)]
        if t.param is not None:
            changes["param"] = f"{t.param}@{new_rep}"
        return evolve(t, **changes) if changes else t

    def split(graph: OpGraph) -> OpGraph:
        templates = dict(graph.templates)
        for rep, (new_rep, keep, other) in moves.items():
            kind = templates[rep].kind if rep in templates else "layer"
            templates[rep] = LayerTemplate(kind, rep, keep)
            templates[new_rep] = LayerTemplate(kind, new_rep, other)
        last_of: dict[int, int] = {}
        for pos, n in enumerate(graph.nodes):
            if n.layer_index in moves:
                last_of[n.layer_index] = pos
        next_id = _next_id(graph)
        copies: dict[int, list[OpNode]] = {}
        id_map: dict[int, int] = {}
        for n in graph.nodes:
            if n.layer_index not in moves:
                continue
            rep = n.layer_index
            new_rep = moves[rep][0]
            attrs = dict(n.attrs)
            for key in ("seq_nr", "fwd_seq_nr"):
                if isinstance(attrs.get(key), int):
                    attrs[key] += _SEQ_OFFSET
            id_map[n.id] = next_id
            copies.setdefault(last_of[rep], []).append(evolve(
                n, id=next_id, layer_index=new_rep, attrs=attrs,
                inputs=tuple(copy_tensor(t, rep, new_rep) for t in n.inputs),
                outputs=tuple(copy_tensor(t, rep, new_rep) for t in n.outputs),
                fused_from=tuple(evolve(m, inputs=tuple(copy_tensor(t, rep, new_rep)
                                                        for t in m.inputs),
                                        outputs=tuple(copy_tensor(t, rep, new_rep)
                                                      for t in m.outputs))
                                 for m in n.fused_from)))
            next_id += 1
        nodes: list[OpNode] = []
        for pos, n in enumerate(graph.nodes):
            nodes.append(n)
            nodes.extend(copies.get(pos, ()))
        layer_of = {n.id: n.layer_index for n in graph.nodes}
        edges = list(graph.edges)
        for a, b in graph.edges:
            if b in id_map:
                edges.append((id_map.get(a, a) if layer_of.get(a) == layer_of.get(b) else a,
                              id_map[b]))
        return evolve(graph.with_nodes(nodes, edges), templates=templates)

    return split(forward), split(backward)


def add_mtp_layers(forward: OpGraph, backward: OpGraph, kinds: Sequence[str], depths: int,
                   *, shared_weights: bool = False) -> tuple[OpGraph, OpGraph, tuple[int, ...]]:
    """Multi-token prediction (DeepSeek-V3; Megatron-Core's ``--mtp-num-layers``) as the
    graphs run it: each of ``depths`` MTP modules is a transformer block of the layer kinds
    ``kinds`` (Nemotron-H's ``"*E"``: attention then MoE; DeepSeek's: one MoE layer) plus its
    own output head and loss over the whole vocabulary. The HF models leave MTP out of the
    forward, so the capture has none of it.

    Each MTP layer is a copy of the representative of the template of its kind, appended
    after the last decoder layer (forward) and before it (backward), as a layer template of
    its own with a new index (``num_layers``, ``num_layers + 1``...): fresh node and tensor
    ids, sequence numbers offset, weights named ``<name>@mtp<d>`` (``@mtp`` for every depth
    with ``shared_weights``: Megatron's ``mtp_use_repeated_layer`` runs one block's weights
    at every depth). Each depth also repeats the outer head side — final norm, LM head (the
    shared output weight) and cross-entropy loss — forward and backward. Not modelled: the
    ``eh_proj`` (2h → h) projection and the two norms that feed each block (``4h²`` FLOPs
    per token against the head's ``2hV``).

    :returns: the graphs and the new layer indices, in order.
    """
    if depths <= 0 or not kinds:
        return forward, backward, ()
    by_kind = {t.kind: rep for rep, t in forward.templates.items()}
    missing = [k for k in kinds if k not in by_kind]
    if missing:
        raise SpecError(f"MTP layer kind(s) {', '.join(missing)} not among the captured "
                        f"templates ({', '.join(by_kind)})")
    top = 1 + max((i for t in forward.templates.values() for i in t.indices), default=-1)
    plan = [(top + d * len(kinds) + j, by_kind[k], d) for d in range(depths)
            for j, k in enumerate(kinds)]
    offset = _tensor_ids((forward, backward))
    counter = [offset]
    renamed: dict[tuple[Any, int], int] = {}

    def fresh(key: Any, t: TensorMeta) -> TensorMeta:
        changes: dict[str, Any] = {}
        if t.tensor_id is not None and (key, t.tensor_id) in renamed:
            changes["tensor_id"] = renamed[(key, t.tensor_id)]
        return evolve(t, **changes) if changes else t

    def produce(key: Any, nodes: Sequence[OpNode]) -> None:
        for n in nodes:
            for t in (t for m in (n, *n.fused_from) for t in m.outputs):
                if t.tensor_id is not None and t.param is None and \
                        (key, t.tensor_id) not in renamed:
                    renamed[(key, t.tensor_id)] = counter[0]
                    counter[0] += 1

    def outer_head(graph: OpGraph) -> list[OpNode]:
        positions = [i for i, n in enumerate(graph.nodes) if n.layer_index is not None]
        if not positions:
            return []
        if graph.phase == Phase.TRAIN_BACKWARD:
            return list(graph.nodes[:positions[0]])
        return list(graph.nodes[positions[-1] + 1:])

    segments = {g.phase: {rep: [n for n in g.nodes if n.layer_index == rep]
                          for _, rep, _ in plan} for g in (forward, backward)}
    heads = {g.phase: outer_head(g) for g in (forward, backward)}
    for new, rep, _d in plan:
        for g in (forward, backward):
            produce(("layer", new), segments[g.phase][rep])
    for d in range(depths):
        for g in (forward, backward):
            produce(("head", d), heads[g.phase])

    def copy_nodes(nodes: Sequence[OpNode], key: Any, start: int, layer: int | None,
                   suffix: str | None, seq: int) -> tuple[list[OpNode], dict[int, int]]:
        out, ids = [], {}
        for i, n in enumerate(nodes):
            attrs = dict(n.attrs)
            for k in ("seq_nr", "fwd_seq_nr"):
                if isinstance(attrs.get(k), int):
                    attrs[k] += seq

            def t2(t: TensorMeta) -> TensorMeta:
                t = fresh(key, t)
                if suffix and t.param is not None:
                    t = evolve(t, param=f"{t.param}@{suffix}")
                return t

            ids[n.id] = start + i
            out.append(evolve(
                n, id=start + i, layer_index=layer if n.layer_index is not None else None,
                attrs=attrs, inputs=tuple(t2(t) for t in n.inputs),
                outputs=tuple(t2(t) for t in n.outputs),
                fused_from=tuple(evolve(m, inputs=tuple(t2(t) for t in m.inputs),
                                        outputs=tuple(t2(t) for t in m.outputs))
                                 for m in n.fused_from)))
        return out, ids

    def extend(graph: OpGraph) -> OpGraph:
        backward_phase = graph.phase == Phase.TRAIN_BACKWARD
        next_id = _next_id(graph)
        layer_copies: list[OpNode] = []
        head_copies: list[OpNode] = []
        edges = list(graph.edges)
        templates = dict(graph.templates)
        order = list(reversed(plan)) if backward_phase else plan
        for new, rep, d in order:
            suffix = "mtp" if shared_weights else f"mtp{d}"
            made, ids = copy_nodes(segments[graph.phase][rep], ("layer", new), next_id, new,
                                   suffix, _SEQ_OFFSET * (2 + new))
            next_id += len(made)
            layer_copies.extend(made)
            edges.extend((ids[a], ids[b]) for a, b in graph.edges if a in ids and b in ids)
            templates[new] = LayerTemplate(forward.templates[rep].kind, new, (new,))
        for d in range(depths):
            made, ids = copy_nodes(heads[graph.phase], ("head", d), next_id, None, None,
                                   _SEQ_OFFSET * (2 + top + len(plan) + d))
            next_id += len(made)
            head_copies.extend(made)
            edges.extend((ids[a], ids[b]) for a, b in graph.edges if a in ids and b in ids)
        positions = [i for i, n in enumerate(graph.nodes) if n.layer_index is not None]
        nodes = list(graph.nodes)
        if backward_phase:
            # the heads' backward first, then the MTP layers', then the decoder's
            nodes = head_copies + nodes[:positions[0]] + layer_copies + nodes[positions[0]:]
        else:
            nodes = nodes[:positions[-1] + 1] + layer_copies + nodes[positions[-1] + 1:] \
                + head_copies
        return evolve(graph.with_nodes(nodes, edges), templates=templates)

    return extend(forward), extend(backward), tuple(new for new, _, _ in plan)
