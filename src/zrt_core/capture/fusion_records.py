"""Which fusion rule made which fused node from which captured nodes: the provenance the
fusion engine leaves on each fused node (``attrs["fusion_rule"]``, ``fused_from``), as rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from attrs import field, frozen

from zrt_core.ir.graph import OpGraph, OpNode


@frozen
class FusionRecord:
    """One fused node of a phase and the captured (raw) nodes it replaced.

    :param pack: the rule pack (``cuda``, ``ascend``, ``generic`` or a plugin's own).
    :param rule: the rule's name inside its pack.
    :param fused_node: the fused node's id in the fused graph (fresh, above every raw id).
    :param raw_nodes: ids of the raw graph's nodes it replaced, in execution order.
    :param raw_ops: their op names, in the same order.
    :param runs: how many times the fused node runs in the whole model (its layer
        template's count; 1 outside the layers).
    """

    phase: str
    pack: str
    rule: str
    fused_node: int
    fused_op: str
    kernel: str
    raw_nodes: tuple[int, ...] = field(converter=tuple)
    raw_ops: tuple[str, ...] = field(converter=tuple)
    module_path: str = ""
    layer_index: int | None = None
    layer_kind: str | None = None
    runs: int = 1

    def to_json(self) -> dict[str, Any]:
        return {
            "phase": self.phase, "pack": self.pack, "rule": self.rule,
            "fused_node": self.fused_node, "fused_op": self.fused_op, "kernel": self.kernel,
            "raw_nodes": list(self.raw_nodes), "raw_ops": list(self.raw_ops),
            "module_path": self.module_path, "layer_index": self.layer_index,
            "layer_kind": self.layer_kind, "runs": self.runs,
        }


def fusion_records(raw: OpGraph, fused: OpGraph) -> list[FusionRecord]:
    """A record per fused node of ``fused`` (the fusion pass's output for ``raw``), in the
    fused graph's execution order.

    A fused node's members may themselves be fused nodes (a graph fused twice, or a rule
    that absorbed an earlier rule's region): they are followed down to the raw graph's
    nodes, so ``raw_nodes`` always names nodes of ``raw``.
    """
    raw_ids = {n.id for n in raw.nodes}
    order = {n.id: i for i, n in enumerate(raw.nodes)}
    records = []
    for node in fused.nodes:
        provenance = node.attrs.get("fusion_rule")
        if not node.fused_from or not provenance:
            continue
        pack, _, rule = str(provenance).partition("/")
        leaves = sorted({m.id: m for m in _leaves(node, raw_ids)}.values(),
                        key=lambda m: order.get(m.id, m.id))
        records.append(FusionRecord(
            phase=fused.phase, pack=pack, rule=rule, fused_node=node.id, fused_op=node.op,
            kernel=str(node.attrs.get("kernel", "")), raw_nodes=[m.id for m in leaves],
            raw_ops=[m.op for m in leaves], module_path=node.module_path,
            layer_index=node.layer_index, layer_kind=node.layer_kind,
            runs=fused.multiplicity(node)))
    return records


def fused_into(records: list[FusionRecord]) -> dict[int, FusionRecord]:
    """Raw node id → the record of the fused node that replaced it."""
    return {raw_id: r for r in records for raw_id in r.raw_nodes}


def _leaves(node: OpNode, raw_ids: set[int]) -> Iterator[OpNode]:
    for member in node.fused_from:
        if member.id in raw_ids or not member.fused_from:
            yield member
        else:
            yield from _leaves(member, raw_ids)
