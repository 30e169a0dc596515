"""Parameters per layer: the inventory of each rank's parameter shard, by group."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from attrs import field, frozen

from zrt_core.ir.graph import (
    LayerTemplate,
    OpGraph,
    TensorMeta,
)
from zrt_core.transforms.training.common import is_expert_param

if TYPE_CHECKING:
    from zrt_core.strategy import Parallel


# -- parameters per layer --------------------------------------------------------------------


@frozen
class ParamGroup:
    """Parameters of one layer template (or of the embedding / head side) on one device.

    ``dense`` and ``expert`` count elements after tensor/expert sharding; ``matrices`` are the
    2-D (and 3-D expert) weight shapes, for Muon.
    """

    key: str
    layer_index: int | None
    dense: int
    expert: int
    matrices: tuple[tuple[int, ...], ...] = field(default=(), converter=tuple)

    @property
    def total(self) -> int:
        return self.dense + self.expert


@frozen
class ParamInventory:
    """Per-device parameter elements by layer template and outer side.

    :param layers: template representative → its :class:`ParamGroup` (one layer's worth).
    :param embedding: parameters used before the first layer (token/position embeddings).
    :param head: parameters used after the last layer (final norm, LM head).
    :param tied_head: elements of the LM head's weight when it is tied to the word
        embedding: Megatron keeps one copy with pp = 1 and a second on the last stage with
        pp > 1 (its gradient all-reduced with the first stage's). 0 when untied (the head's
        weight is then in ``head``).
    """

    layers: Mapping[int, ParamGroup]
    embedding: ParamGroup
    head: ParamGroup
    tied_head: int = 0
    #: the parameters that train when not all do (LoRA's adapters): gradients and optimizer
    #: states; None when every parameter trains
    trainable: ParamInventory | None = None

    def stage(self, layers: Iterable[int], templates: Mapping[int, LayerTemplate], *,
              first: bool, last: bool, pp: int) -> tuple[int, int]:
        """(dense, expert) elements of a pipeline stage holding ``layers``."""
        rep_of = {i: rep for rep, t in templates.items() for i in t.indices}
        return self.stage_of(layers, rep_of, first=first, last=last, pp=pp)

    def stage_of(self, layers: Iterable[int], rep_of: Mapping[int, int], *, first: bool,
                 last: bool, pp: int) -> tuple[int, int]:
        """:meth:`stage` with the layer templates given as layer index → representative."""
        dense = expert = 0
        for i in layers:
            g = self.layers.get(rep_of.get(i, i))
            if g is not None:
                dense += g.dense
                expert += g.expert
        if first:
            dense += self.embedding.dense
        if last:
            dense += self.head.dense
            if pp > 1:
                dense += self.tied_head
        return dense, expert


def param_inventory(forward: OpGraph, parallel: Parallel, dims: Any) -> ParamInventory:
    """Parameter elements per device from the forward graph's weight tensors.

    When the graph's weights are still the full model's (the parallel transform, which
    records ``meta["parallel"]``, has not run), Megatron's sharding is
    applied by rule: routed-expert weights ``/ (ep × expert tp)``; 1-D parameters of the
    hidden size (norms, row-parallel biases) and router weights replicated; everything else
    (QKV/output/MLP/SSM projections, vocabulary-parallel embedding and head) ``/ tp``.
    """
    sharded = "parallel" in forward.meta
    hidden = getattr(dims, "hidden", 0)
    experts = getattr(dims, "experts", 0)
    first_layer_pos = next((i for i, n in enumerate(forward.nodes)
                            if n.layer_index is not None), len(forward.nodes))
    seen: set[str] = set()
    per_layer: dict[int | None, list[int]] = {}
    matrices: dict[int | None, list[tuple[int, ...]]] = {}
    outer_side: dict[str, str] = {}
    buckets: dict[str, list[int]] = {"embedding": [0, 0], "head": [0, 0]}
    outer_matrices: dict[str, list[tuple[int, ...]]] = {"embedding": [], "head": []}
    for pos, n in enumerate(forward.nodes):
        for t in n.inputs:
            name = t.param
            if name is None or name in seen:
                continue
            seen.add(name)
            expert = is_expert_param(name)
            numel, shape = _local_param(t, expert, sharded, parallel, hidden, experts)
            if n.layer_index is None:
                side = "embedding" if pos < first_layer_pos else "head"
                outer_side[name] = side
                buckets[side][1 if expert else 0] += numel
                if len(shape) >= 2:
                    outer_matrices[side].append(shape)
            else:
                acc = per_layer.setdefault(n.layer_index, [0, 0])
                acc[1 if expert else 0] += numel
                if len(shape) >= 2:
                    matrices.setdefault(n.layer_index, []).append(shape)
    layers = {i: ParamGroup(f"layer{i}", i, d, e, matrices.get(i, ()))
              for i, (d, e) in per_layer.items() if i is not None}
    tied = 0
    if getattr(dims, "tie_word_embeddings", False):
        # the head's weight has the word embedding's shape (transposed or not)
        word = [sh for sh in outer_matrices["embedding"] if sh and
                max(sh) >= getattr(dims, "vocab", 0) // max(parallel.tp, 1)]
        for sh in list(outer_matrices["head"]):
            if any(sh == w or sh == tuple(reversed(w)) for w in word):
                tied = math.prod(sh)
                outer_matrices["head"].remove(sh)
                buckets["head"][0] -= tied
                break
    return ParamInventory(
        layers=layers,
        embedding=ParamGroup("embedding", None, *buckets["embedding"],
                             outer_matrices["embedding"]),
        head=ParamGroup("head", None, *buckets["head"], outer_matrices["head"]),
        tied_head=tied)


def _local_param(t: TensorMeta, expert: bool, sharded: bool, parallel: Parallel,
                 hidden: int, experts: int) -> tuple[int, tuple[int, ...]]:
    shape = t.shape
    if sharded:
        return t.numel, shape
    if expert:
        ep, etp = parallel.ep, parallel.expert_tp
        if len(shape) == 3 and shape[0] % ep == 0:
            shape = (shape[0] // ep, shape[1], shape[2])
        else:
            return t.numel // (ep * etp), shape
        if etp > 1:
            shape = (shape[0], shape[1], max(1, shape[2] // etp))
        return math.prod(shape), shape
    tp = parallel.tp
    if tp == 1:
        return t.numel, shape
    replicated = (len(shape) == 1 and shape[0] == hidden) or \
        (len(shape) == 2 and experts and shape[0] == experts)
    if replicated:
        return t.numel, shape
    if len(shape) >= 2:
        shape = (max(1, shape[0] // tp), *shape[1:])
        return math.prod(shape), shape
    return max(1, t.numel // tp), (max(1, t.numel // tp),)
