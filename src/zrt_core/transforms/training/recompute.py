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
from zrt_core.transforms.training.recompute_modules import (
    DEFAULT_MODULES,
    FULL_CHECKPOINT,
    NEEDS,
    OUTPUT_DISCARDING,
    RECOMPUTE_MODULES,
    LayerFlow,
    module_regions,
)

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
    - ``op``: PyTorch's selective activation checkpointing with torchtitan's op policy
      (``activation_checkpoint.mode = "selective"``, ``selective_ac_option = "op"``, its
      default): each layer is a checkpoint whose policy saves the outputs of ``aten.mm``
      except every second one, of the SDPA kernels and of reduce-scatters; every other op of
      the layer re-runs when its backward starts (:func:`op_policy_saved`).

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
    #: under ``selective``: Megatron-Core's ``recompute_modules`` (None: its default,
    #: ``["core_attn"]``)
    modules: Sequence[str] | None = None
    name: str = "recompute"

    def apply(self, graph: OpGraph, ctx: TransformContext) -> OpGraph:
        if graph.phase != Phase.TRAIN_BACKWARD:
            raise SpecError(f"recompute applies to the train_backward graph, not {graph.phase}")
        if self.mode == "none":
            return graph
        if self.mode not in ("selective", "full", "op"):
            raise SpecError(f"unknown recompute mode {self.mode!r}",
                            "use none, selective, full or op")
        fwd_by_layer: dict[int, list[OpNode]] = {}
        for n in self.forward.nodes:
            if n.layer_index is not None:
                fwd_by_layer.setdefault(n.layer_index, []).append(n)
        if self.mode == "full":
            return self._full(graph, fwd_by_layer)
        if self.mode == "op":
            kept = {layer: op_policy_saved(nodes) for layer, nodes in fwd_by_layer.items()}
            return self._full(graph, {layer: [n for n in nodes if n.id not in kept[layer]]
                                      for layer, nodes in fwd_by_layer.items()})
        modules = DEFAULT_MODULES if self.modules is None else tuple(self.modules)
        bad = [m for m in modules if m not in RECOMPUTE_MODULES]
        if bad:
            raise SpecError(f"unknown recompute module {bad[0]!r}",
                            f"use any of {', '.join(RECOMPUTE_MODULES)}")
        layers = {i: LayerFlow(nodes) for i, nodes in fwd_by_layer.items()}
        out = graph
        # ordinary checkpoints first: a discarded output a checkpoint's re-run reads is
        # restored before that re-run (Megatron's hook fires on the later tensor's grad)
        for module in (*FULL_CHECKPOINT, *OUTPUT_DISCARDING):
            if module not in modules:
                continue
            regions = {i: module_regions(module, layer) for i, layer in layers.items()}
            if module in NEEDS and layers and not any(regions.values()):
                raise SpecError(f"recompute module {module} needs {NEEDS[module]}, which "
                                "this model does not have (Megatron-Core refuses it too)",
                                "drop it from --recompute-modules")
            out = self._insert(out, module, regions)
        meta = {**graph.meta, "recompute": self.mode, "recompute_modules": list(modules)}
        return evolve(out, meta=meta)

    def _full(self, graph: OpGraph, fwd_by_layer: Mapping[int, list[OpNode]]) -> OpGraph:
        """``full``: each layer's whole forward before the layer's first backward node
        (``op``: the layer's forward less what its policy saved)."""
        node_offset = _next_id(graph)
        tensor_offset = _tensor_ids((graph, self.forward))
        copies: dict[int, list[OpNode]] = {}
        renamed: dict[int, int] = {}
        new_edges: list[tuple[int, int]] = []
        first_bwd: dict[int, int] = {}
        for n in graph.nodes:
            if n.layer_index is not None and n.layer_index not in first_bwd:
                first_bwd[n.layer_index] = n.id
        for layer, nodes in fwd_by_layer.items():
            if layer not in first_bwd or not nodes:
                continue
            made = self._copy(nodes, node_offset, tensor_offset, renamed)
            node_offset += len(made)
            copies.setdefault(first_bwd[layer], []).extend(made)
            new_edges.extend(_copied_edges(nodes, made, self.forward.edges))
            new_edges.append((made[-1].id, first_bwd[layer]))
        out: list[OpNode] = []
        for n in graph.nodes:
            out.extend(copies.get(n.id, ()))
            out.append(_rename_inputs(n, renamed) if n.layer_index is not None else n)
        result = graph.with_nodes(out, [*graph.edges, *new_edges])
        return evolve(result, meta={**graph.meta, "recompute": self.mode})

    def _insert(self, graph: OpGraph, module: str,
                regions: Mapping[int, list[list[OpNode]]]) -> OpGraph:
        """Copy each region of ``module`` before the backward node that first needs it; the
        backward nodes from there on read the re-computed tensors (so the originals are no
        longer kept, unless an earlier backward node still reads them)."""
        node_offset = _next_id(graph)
        tensor_offset = _tensor_ids((graph, self.forward))
        nodes = list(graph.nodes)
        index = {n.id: i for i, n in enumerate(nodes)}
        copies: dict[int, list[OpNode]] = {}
        renames: list[tuple[int, dict[int, int]]] = []  # (position, forward id -> new id)
        new_edges: list[tuple[int, int]] = []
        for layer, found in regions.items():
            for region in found:
                target = self._target(module, region, nodes, layer)
                if target is None:
                    continue
                renamed: dict[int, int] = {}
                made = self._copy(region, node_offset, tensor_offset, renamed)
                node_offset += len(made)
                copies.setdefault(target.id, []).extend(made)
                renames.append((index[target.id], renamed))
                new_edges.extend(_copied_edges(region, made, self.forward.edges))
                new_edges.append((made[-1].id, target.id))
        if not copies:
            return graph
        out: list[OpNode] = []
        for i, n in enumerate(nodes):
            out.extend(copies.get(n.id, ()))
            if n.layer_index is not None:
                for at, renamed in renames:
                    if i >= at:
                        n = _rename_inputs(n, renamed)
            out.append(n)
        return graph.with_nodes(out, [*graph.edges, *new_edges])

    @staticmethod
    def _target(module: str, region: Sequence[OpNode], nodes: Sequence[OpNode],
                layer: int) -> OpNode | None:
        """The backward node a region's re-run goes just before, or None (nothing reads it)."""
        if module == "core_attn":
            # the attention core's own backward (its output stays saved for the projection)
            seq = next((c.attrs.get("seq_nr") for c in reversed(region)
                        if c.attrs.get("seq_nr") is not None), None)
            return next((n for n in nodes if n.layer_index is not None and
                         n.attrs.get("fwd_seq_nr") == seq and
                         (n.category == Category.ATTENTION or
                          n.attrs.get(CORE_ATTENTION_ATTR))), None)
        if module in FULL_CHECKPOINT:
            # an ordinary checkpoint re-runs when the backward enters the wrapped module
            paths = {n.module_path for n in region if n.module_path}
            return next((n for n in nodes if n.layer_index == layer
                         and not n.attrs.get(RECOMPUTE_ATTR)
                         and any(n.module_path == p or n.module_path.startswith(p + ".")
                                 for p in paths)), None)
        # output-discarding: just before the first backward node that reads an output
        outputs = {t.tensor_id for r in region for t in r.outputs if t.tensor_id is not None}
        return next((n for n in nodes if n.layer_index == layer
                     and any(t.tensor_id in outputs for t in n.inputs)), None)

    def _copy(self, nodes: Sequence[OpNode], node_offset: int, tensor_offset: int,
              renamed: dict[int, int]) -> list[OpNode]:
        made = []
        for i, n in enumerate(nodes):
            # a fused node's members (their internal tensors, the views a fused backward
            # reads) are re-made with it: renamed too, so the backward reads the copies
            for m in n.members:
                for t in m.outputs:
                    if t.tensor_id is not None and t.param is None:
                        renamed[t.tensor_id] = t.tensor_id + tensor_offset
            attrs = {k: v for k, v in n.attrs.items() if k != "seq_nr"}
            attrs[RECOMPUTE_ATTR] = True
            if "seq_nr" in n.attrs:
                attrs["fwd_seq_nr"] = n.attrs["seq_nr"]
            if n.category == Category.COLLECTIVE and "overlap" not in attrs:
                attrs["overlap"] = _forward_hint(n, self.rules)
            made.append(evolve(
                n.with_tensors(lambda t: _renamed(t, renamed)), id=node_offset + i,
                phase=Phase.TRAIN_BACKWARD,
                attrs=attrs))
        return made


#: GEMM precisions whose forward is ``torch._scaled_mm`` (torchao's float8 linears), which
#: torchtitan's op policy does not save
_SCALED_MM = ("fp8", "fp8_cs", "mxfp8", "nvfp4")


def op_policy_saved(nodes: Sequence[OpNode]) -> set[int]:
    """Ids of one layer's forward nodes whose outputs torchtitan's op policy saves.

    torchtitan's ``_save_list`` (``models/llama3/parallelize_llama.py`` at e7c0cae, the same
    at 9dec370) holds ``aten.mm``, the flash and memory-efficient SDPA kernels, the
    functional ``reduce_scatter_tensor`` and ``aten.max``; its policy counts the layer's
    ``aten.mm`` calls and saves the odd ones ("Saves output of all compute ops, except every
    second mm"). A float8 linear runs ``aten._scaled_mm``, which is not on the list, so it
    re-runs with its casts; so do all-gathers, norms, RoPE and the activation."""
    saved: set[int] = set()
    mm = 0
    for n in nodes:
        if n.op == "aten.mm.default" and n.attrs.get("precision") not in _SCALED_MM:
            mm += 1
            if mm % 2:
                saved.add(n.id)
        elif n.category == Category.ATTENTION or n.attrs.get(CORE_ATTENTION_ATTR) or (
                n.category == Category.COLLECTIVE
                and n.attrs.get("collective") == "reduce_scatter"):
            saved.add(n.id)
    return saved


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
