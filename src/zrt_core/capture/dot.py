"""One decoder layer of a captured phase as Graphviz DOT text: its ops as nodes, their dataflow
as edges, each fused region as a cluster labelled with the rule that fused it.

Plain text, no graphviz needed to write it: ``dot -Tsvg prefill.layer-dense.dot`` renders it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from zrt_core.capture.fusion_records import FusionRecord
from zrt_core.ir.graph import Category, OpGraph, OpNode

#: Fill colours by op category (others are white); zero-cost views are dashed grey.
CATEGORY_COLORS = {
    Category.MATMUL: "#c6dbef", Category.ATTENTION: "#fdd0a2",
    Category.NORM: "#c7e9c0", Category.SOFTMAX: "#dadaeb",
    Category.ELEMENTWISE: "#f0f0f0", Category.COLLECTIVE: "#fcbba1",
    Category.MOE_ROUTER: "#fee391", Category.MOE_DISPATCH: "#fee391",
    Category.MOE_COMBINE: "#fee391", Category.SSM: "#fdd0a2",
}

#: The pseudo-nodes standing for everything outside the layer that feeds it / reads it.
OUTSIDE_IN, OUTSIDE_OUT = "outside_in", "outside_out"


def layers_by_kind(graph: OpGraph) -> dict[str, int]:
    """Each layer kind's first layer in execution order (its template's representative
    when the graph has templates): the layer a DOT file draws for that kind."""
    out: dict[str, int] = {}
    for node in graph.nodes:
        if node.layer_index is None:
            continue
        kind = node.layer_kind or _template_kind(graph, node.layer_index)
        out.setdefault(kind, node.layer_index)
    return out


def _template_kind(graph: OpGraph, layer: int) -> str:
    template = graph.templates.get(layer)
    return template.kind if template is not None else f"layer{layer}"


def layer_dot(graph: OpGraph, layer: int, *, records: Iterable[FusionRecord] = (),
              title: str = "") -> str:
    """DOT text of ``graph``'s ops in decoder layer ``layer``.

    Edges are the graph's edges between two ops of the layer; an edge from (to) an op
    outside the layer is drawn once per op of the layer, from :data:`OUTSIDE_IN` (to
    :data:`OUTSIDE_OUT`). ``records`` (from :func:`~zrt_core.capture.fusion_records.
    fusion_records`) draw each fused region of the layer as a cluster of its raw ops.
    """
    nodes = [n for n in graph.nodes if n.layer_index == layer]
    inside = {n.id for n in nodes}
    kind = nodes[0].layer_kind if nodes and nodes[0].layer_kind else \
        _template_kind(graph, layer)
    name = title or f"{graph.phase} layer {layer} ({kind})"
    lines = [f"digraph {_quote(name)} {{",
             f"  label={_quote(name + f' · {len(nodes)} ops')};",
             "  labelloc=t;",
             "  rankdir=TB;",
             '  node [shape=box, style="rounded,filled", fillcolor="#ffffff", '
             'fontname="Helvetica", fontsize=10];',
             '  edge [color="#606060"];']
    clustered: set[int] = set()
    for record in records:
        members = [i for i in record.raw_nodes if i in inside]
        if not members:
            continue
        clustered.update(members)
        label = f"{record.pack}/{record.rule} → {record.fused_op} #{record.fused_node}"
        lines.append(f"  subgraph {_quote(f'cluster_f{record.fused_node}')} {{")
        lines.append(f"    label={_quote(label)};")
        lines.append('    style="rounded,dashed";')
        lines.append('    color="#b03060";')
        chosen = set(members)
        lines.extend(f"    {_node_stmt(n, layer)}" for n in nodes if n.id in chosen)
        lines.append("  }")
    lines.extend(f"  {_node_stmt(n, layer)}" for n in nodes if n.id not in clustered)
    edges_in: dict[int, None] = {}
    edges_out: dict[int, None] = {}
    inner: list[tuple[int, int]] = []
    for a, b in graph.edges:
        if a in inside and b in inside:
            inner.append((a, b))
        elif b in inside:
            edges_in[b] = None
        elif a in inside:
            edges_out[a] = None
    if edges_in:
        lines.append(f'  {OUTSIDE_IN} [label="from outside the layer", shape=ellipse, '
                     'style=dashed];')
    if edges_out:
        lines.append(f'  {OUTSIDE_OUT} [label="to outside the layer", shape=ellipse, '
                     'style=dashed];')
    lines.extend(f"  {OUTSIDE_IN} -> n{b};" for b in edges_in)
    lines.extend(f"  n{a} -> n{b};" for a, b in dict.fromkeys(inner))
    lines.extend(f"  n{a} -> {OUTSIDE_OUT};" for a in edges_out)
    lines.append("}")
    return "\n".join(lines) + "\n"


def write_layer_dots(out_dir: Path, graph: OpGraph, *,
                     records: Mapping[int, FusionRecord] | Iterable[FusionRecord] = ()
                     ) -> list[Path]:
    """Write ``<phase>.layer-<kind>.dot`` for each layer kind of ``graph`` (its first layer);
    returns the paths written (none for a graph without decoder layers)."""
    recs = list(records.values() if isinstance(records, Mapping) else records)
    paths = []
    for kind, layer in layers_by_kind(graph).items():
        path = out_dir / f"{graph.phase}.layer-{file_safe(kind)}.dot"
        path.write_text(layer_dot(graph, layer, records=recs), encoding="utf-8")
        paths.append(path)
    return paths


def file_safe(text: str) -> str:
    """``full_attention+moe`` → ``full_attention_moe``: a layer kind as part of a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "layer"


def _node_stmt(node: OpNode, layer: int) -> str:
    op = node.op.removeprefix("aten.").removesuffix(".default")
    label = f"#{node.id} {op}\n{_in_layer(node.module_path, layer)}"
    if node.flops:
        label += f"\n{node.flops:,} FLOPs"
    if node.zero_cost:
        style = 'style="rounded,dashed", fontcolor="#808080", color="#a0a0a0"'
    else:
        style = f'fillcolor="{CATEGORY_COLORS.get(node.category, "#ffffff")}"'
    return f"n{node.id} [label={_quote(label)}, {style}];"


def _in_layer(path: str, layer: int) -> str:
    """``model.layers.7.mlp.up_proj`` → ``mlp.up_proj`` in layer 7; the layer's own module
    is ``(layer)``."""
    parts = path.split(".")
    if str(layer) in parts:
        rest = parts[parts.index(str(layer)) + 1:]
        return ".".join(rest) or "(layer)"
    return path


def _quote(text: str) -> str:
    r"""A DOT double-quoted string: backslashes and quotes escaped, newlines as ``\n``."""
    body = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{body}"'
