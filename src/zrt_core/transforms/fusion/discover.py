"""Fusion-rule discovery: draft a rule pack from a model's captured graphs by the reference
design's two-stage grouping, marking what the installed packs already fuse.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import yaml
from attrs import evolve, field, frozen

from zrt_core.ir.graph import Category, OpGraph, OpNode, Phase
from zrt_core.transforms.fusion.rules import FusionRulePack, packs_for_platform
from zrt_core.transforms.fusion.transform import fuse

if TYPE_CHECKING:
    from zrt_core.plugins import PluginHost

#: Stage two: a group merges into its parent module while the parent holds at most this
#: many ops (non-view ops, its sub-modules' included) — the reference design's threshold.
MAX_PARENT_OPS = 30

#: Ops a drafted kernel keeps as its anchor or leaves alone: a fused node is priced as one
#: op, so at most one of them (the anchor, whose op and attrs the node keeps) joins it.
HEAVY = (Category.MATMUL, Category.ATTENTION, Category.SSM, Category.COLLECTIVE)

#: A rule's category when its ops hold one of these (first found wins), else ``norm`` for a
#: ``*Norm`` class, else ``elementwise``.
_CATEGORY_ORDER = (Category.LOSS, Category.MOE_ROUTER, Category.MOE_DISPATCH,
                   Category.MOE_COMBINE, Category.SOFTMAX, Category.NORM)

_SIDES = {"forward": (Phase.PREFILL, Phase.DECODE, Phase.TRAIN_FORWARD),
          "backward": (Phase.TRAIN_BACKWARD,)}

#: Capture settings for discovery: the op sequence, not its sizes, is what matters.
DISCOVERY_SEQ_LEN = 64


def op_token(op: str) -> str:
    """The rule token of an op: its overload dropped (``aten.mul.Tensor`` → ``aten.mul``),
    which matches every overload of it."""
    parts = op.split(".")
    return ".".join(parts[:-1]) if len(parts) >= 3 else op


def snake(name: str) -> str:
    """``LlamaRMSNorm`` → ``llama_rms_norm``; ``GPT2MLP`` → ``gpt2_mlp``."""
    text = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()
    text = re.sub(r"[^a-z0-9_]+", "_", text).strip("_")
    return text if text and (text[0].isalpha() or text[0] == "_") else f"m_{text}"


# -- stage one and two ----------------------------------------------------------------------


@frozen
class Group:
    """One candidate instance in one graph: the ops of a module (and, when merged, of its
    sub-modules) that one drafted kernel would run.

    :param descendants: merged into this module from its sub-modules (stage two).
    :param node_ids: the non-view ops, in execution order.
    :param inside: for a stage-one group inside a merged one, the merged module's path
        (its rule fuses what the merged rule leaves); ``""`` for the groups that partition
        the graph's ops.
    """

    phase: str
    module_path: str
    module_class: str
    descendants: bool
    node_ids: tuple[int, ...] = field(converter=tuple)
    ops: tuple[str, ...] = field(converter=tuple)
    categories: tuple[str, ...] = field(converter=tuple)
    inside: str = ""

    @property
    def side(self) -> str:
        return "backward" if self.phase == Phase.TRAIN_BACKWARD else "forward"


def _ancestors(path: str) -> list[str]:
    """``a.b.c`` → ``[a.b, a]``: nearest first, the root (``""``) left out."""
    parts = path.split(".") if path else []
    return [".".join(parts[:k]) for k in range(len(parts) - 1, 0, -1)]


def group_ops(graph: OpGraph, max_parent_ops: int = MAX_PARENT_OPS) -> list[Group]:
    """The reference design's two stages over one graph.

    1. Consecutive ops of one module form a group (views and other zero-cost nodes are
       skipped: the fusion engine absorbs them).
    2. A group merges into its nearest ancestor module, and on up, while that ancestor
       holds at most ``max_parent_ops`` ops, all of one layer; only modules that own a
       node (so a rule can name their class) are merge targets, the root never.

    The merged groups come first, then the stage-one groups inside them: their rules fuse
    what a merged rule cannot (a module whose ops do not form one region without a path
    out and back, GPT-2's block around its GEMMs).
    """
    nodes = graph.nodes
    classes: dict[str, str] = {}  # path -> its first named class (a rule's scope)
    for n in nodes:
        if n.module_class or n.module_path not in classes:
            if not classes.get(n.module_path):
                classes[n.module_path] = n.module_class
    ops = [n for n in nodes if not n.zero_cost]
    count: dict[str, int] = {}
    layers: dict[str, set[int | None]] = {}
    for n in ops:
        for a in (n.module_path, *_ancestors(n.module_path)):
            count[a] = count.get(a, 0) + 1
            layers.setdefault(a, set()).add(n.layer_index)

    target: dict[str, str] = {}

    def target_of(path: str) -> str:
        hit = target.get(path)
        if hit is None:
            hit = path
            for a in _ancestors(path):
                if count.get(a, 0) > max_parent_ops or len(layers.get(a, ())) > 1:
                    break
                if a in classes:
                    hit = a
            target[path] = hit
        return hit

    merged = {t for n in ops if (t := target_of(n.module_path)) != n.module_path}
    out: list[list[OpNode]] = []
    keyed: dict[str, list[OpNode]] = {}
    last_path: str | None = None
    for n in ops:
        t = target_of(n.module_path)
        if t in merged:
            if t not in keyed:
                keyed[t] = []
                out.append(keyed[t])
            keyed[t].append(n)
            last_path = None
        elif last_path == t:
            out[-1].append(n)
        else:
            out.append([n])
            last_path = t
    def group(path: str, members: list[OpNode], descendants: bool, inside: str = "") -> Group:
        return Group(phase=graph.phase, module_path=path, module_class=classes.get(path, ""),
                     descendants=descendants, node_ids=[n.id for n in members],
                     ops=[op_token(n.op) for n in members],
                     categories=[n.category for n in members], inside=inside)

    groups, inner = [], []
    for members in out:
        path = target_of(members[0].module_path)
        groups.append(group(path, members, path in merged))
        if path in merged:  # its stage-one groups: what a merged rule leaves, fused after
            run: list[OpNode] = []
            for n in members:
                if run and n.module_path != run[-1].module_path:
                    inner.append(group(run[-1].module_path, run, False, path))
                    run = []
                run.append(n)
            inner.append(group(run[-1].module_path, run, False, path))
    return groups + inner


# -- candidates ---------------------------------------------------------------------------


@frozen
class Candidate:
    """One drafted rule: the groups of one module class (and side: forward or backward).

    :param ops: the tokens the rule fuses (the anchor first when there is one).
    :param anchor: the one heavy op (attention, or a lone GEMM) the fused node keeps.
    :param status: ``new`` (the installed packs fuse none of its ops), ``partial`` (some),
        ``covered`` (all, written commented out), ``single`` (fewer than two ops to fuse),
        ``unscoped`` (its module has no class to name) or ``inert`` (the drafted pack
        fuses nothing with it in the model's own graphs): no rule.
    :param covered_by: the installed ``pack/rule`` names that fuse any of its ops.
    """

    name: str
    module_class: str
    descendants: bool
    side: str
    phases: tuple[str, ...] = field(converter=tuple)
    paths: tuple[str, ...] = field(converter=tuple)
    ops: tuple[str, ...] = field(converter=tuple)
    anchor: str | None
    category: str
    max_ops: int
    status: str
    covered_by: tuple[str, ...] = field(converter=tuple)
    groups: tuple[Group, ...] = field(default=(), converter=tuple, repr=False)

    @property
    def active(self) -> bool:
        return self.status in ("new", "partial")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "module_class": self.module_class,
                "descendants": self.descendants, "side": self.side,
                "phases": list(self.phases), "paths": list(self.paths),
                "ops": list(self.ops), "anchor": self.anchor, "category": self.category,
                "max_ops": self.max_ops, "status": self.status,
                "covered_by": list(self.covered_by)}


def _anchor(group: Group) -> str | None:
    """The group's one attention (or SSM) op, else its one GEMM when it has no other heavy
    op; None when it has several (they stay kernels of their own)."""
    heavy = [(op, c) for op, c in zip(group.ops, group.categories, strict=True) if c in HEAVY]
    special = [op for op, c in heavy if c in (Category.ATTENTION, Category.SSM)]
    if len(special) == 1:
        return special[0]
    if not special and len(heavy) == 1 and heavy[0][1] == Category.MATMUL:
        return heavy[0][0]
    return None


def _fused_leaves(graph: OpGraph) -> dict[int, list[str]]:
    """Original node id → the ``pack/rule`` names of the fused nodes holding it (outer
    fusions of an earlier fused node included: ``add_rms_norm`` over ``rms_norm``)."""
    out: dict[int, list[str]] = {}

    def walk(node: OpNode, rules: list[str]) -> None:
        rule = node.attrs.get("fusion_rule") if node.fused_from else None
        here = [*rules, str(rule)] if rule else rules
        if node.fused_from:
            for child in node.fused_from:
                walk(child, here)
        elif here:
            out.setdefault(node.id, []).extend(here)

    for node in graph.nodes:
        walk(node, [])
    return out


def _category(module_class: str, categories: Iterable[str]) -> str:
    present = set(categories)
    for c in _CATEGORY_ORDER:
        if c in present:
            return c
    return Category.NORM if module_class.endswith("Norm") else Category.ELEMENTWISE


def candidates(graphs: Mapping[str, OpGraph], packs: Sequence[FusionRulePack] = (),
               max_parent_ops: int = MAX_PARENT_OPS) -> list[Candidate]:
    """The drafted rules of ``graphs`` (raw captured graphs, one per phase), each marked by
    what ``packs`` (applied as :func:`fuse` applies them) already fuse of its ops."""
    keyed: dict[tuple[str, bool, str], list[Group]] = {}
    fused_by: dict[str, dict[int, list[str]]] = {}
    for phase, graph in graphs.items():
        fused_by[phase] = _fused_leaves(fuse(graph, packs)) if packs else {}
        for g in group_ops(graph, max_parent_ops):
            keyed.setdefault((g.module_class, g.descendants, g.side), []).append(g)
    names: set[str] = set()
    out = []
    for (cls, descendants, side), groups in keyed.items():
        anchors = {_anchor(g) for g in groups}
        anchor = anchors.pop() if len(anchors) == 1 else None
        tokens: dict[str, None] = {}
        relevant: list[tuple[str, int]] = []  # (phase, node id) a drafted kernel would fuse
        size = 0
        cats: list[str] = []
        for g in groups:
            n = 0
            for nid, op, c in zip(g.node_ids, g.ops, g.categories, strict=True):
                if c in HEAVY and not (anchor is not None and op == anchor):
                    continue
                if op != anchor:
                    tokens[op] = None
                    cats.append(c)
                relevant.append((g.phase, nid))
                n += 1
            size = max(size, n)
        # covered_by: every installed rule fusing an op of it (a lone GEMM's or attention's
        # kernel rule included); the status counts the ops a drafted rule would fuse
        rules = {r: None for g in groups for nid in g.node_ids
                 for r in fused_by[g.phase].get(nid, ())}
        hit = sum(1 for phase, nid in relevant if fused_by[phase].get(nid))
        if size < 2:
            status = "single"
        elif not cls:
            status = "unscoped"  # no class to name in a scope
        elif hit == len(relevant):
            status = "covered"
        else:
            status = "partial" if hit else "new"
        base = snake(cls or "root") + ("_backward" if side == "backward" else "")
        name, k = base, 2
        while name in names:
            name, k = f"{base}_{k}", k + 1
        names.add(name)
        phases = tuple(p for p in Phase.ALL if any(g.phase == p for g in groups))
        ops = ((anchor,) if anchor else ()) + tuple(tokens)
        category = (next(c for op, c in zip(groups[0].ops, groups[0].categories, strict=True)
                         if op == anchor) if anchor else _category(cls, cats))
        out.append(Candidate(
            name=name, module_class=cls, descendants=descendants, side=side, phases=phases,
            paths=tuple(dict.fromkeys(g.module_path for g in groups)), ops=ops,
            anchor=anchor, category=category, max_ops=size, status=status,
            covered_by=tuple(rules), groups=tuple(groups)))
    out.sort(key=lambda c: not c.descendants)  # merged rules first, stage one after
    return _mark_inert(out, graphs)


def _mark_inert(found: list[Candidate], graphs: Mapping[str, OpGraph]) -> list[Candidate]:
    """Status ``inert`` for a rule that, in the drafted pack applied alone, fuses nothing in
    the graphs it was drafted from (a merged module that is not one region, an anchored
    rule whose anchor's neighbours reach it only through a GEMM)."""
    draft = Discovery(model="", platform="generic", candidates=found).pack(
        include_covered=True)
    fired: set[str] = set()
    for graph in graphs.values():
        fired.update(fuse(graph, [draft]).meta.get("fusion", {}).get("fused", {}))
    return [evolve(c, status="inert")
            if c.status not in ("single", "unscoped") and f"{draft.name}/{c.name}" not in fired
            else c for c in found]


# -- the pack -----------------------------------------------------------------------------


@frozen
class Discovery:
    """A drafted pack: the candidates of one model and platform, and their YAML."""

    model: str
    platform: str
    candidates: tuple[Candidate, ...] = field(converter=tuple)
    pack_name: str = "discovered"
    covered_packs: tuple[str, ...] = field(default=(), converter=tuple)

    def rules(self, include_covered: bool = False) -> list[Candidate]:
        """The candidates written as rules: the active ones (and the covered ones)."""
        return [c for c in self.candidates
                if c.active or (include_covered and c.status == "covered")]

    def to_yaml(self, include_covered: bool = False) -> str:
        """The pack in zrt's rule-pack format (docs/fusion.md); covered candidates are
        written commented out unless ``include_covered``."""
        q = json.dumps
        lines = [
            f"# Drafted by `zrt fusion discover {self.model} --platform {self.platform}`: one "
            "rule per module class,",
            f"# grouping each module's consecutive ops and merging into a parent of at most "
            f"{MAX_PARENT_OPS} ops.",
            "# Load it ahead of the installed packs with `--fusion-rules FILE`; review each "
            "kernel first.",
            "# Format: docs/fusion.md.",
            f"name: {self.pack_name}",
            f"platform: {self.platform}",
            f"description: {q(f'Drafted fusion rules for {self.model}')}",
            "rules:",
        ]
        written = 0
        for c in self.candidates:
            if c.status in ("single", "unscoped", "inert"):
                continue
            block = _rule_lines(c)
            if c.active or include_covered:
                if c.covered_by:
                    lines.append(f"  # {c.status}: the installed packs fuse part of it today "
                                 f"({', '.join(c.covered_by)})")
                lines.extend(block)
                written += 1
            else:
                lines.append(f"  # covered by {', '.join(c.covered_by)}:")
                lines.extend("  # " + line[2:] for line in block)
        if not written:
            lines[-1] = "rules: []"
        return "\n".join(lines) + "\n"

    def pack(self, include_covered: bool = False) -> FusionRulePack:
        """The pack :meth:`to_yaml` writes, read back as zrt reads a ``--fusion-rules``
        file."""
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml where built
        return FusionRulePack.from_mapping(yaml.load(self.to_yaml(include_covered), loader),
                                           source=f"<discovered {self.model}>", user=True)

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "platform": self.platform, "pack": self.pack_name,
                "installed_packs": list(self.covered_packs),
                "candidates": [c.to_json() for c in self.candidates]}


def _rule_lines(c: Candidate) -> list[str]:
    q = json.dumps
    where = (c.paths[0] or "the top level") + (
        f" and {len(c.paths) - 1} more" if len(c.paths) > 1 else "")
    what = "and its sub-modules" if c.descendants else "own ops"
    scope = f"{{module_class: {q(c.module_class)}" + (", descendants: true}"
                                                      if c.descendants else "}")
    lines = [
        f"  - name: {c.name}",
        f"    description: {q(f'{c.module_class} {what} ({where}): up to {c.max_ops} ops')}",
        f"    scope: {scope}",
        f"    phases: [{', '.join(c.phases)}]",
        "    match: connected",
        f"    ops: [{', '.join(c.ops)}]",
    ]
    if c.anchor:
        lines.append(f"    requires: [{c.anchor}]")
    lines.append("    min_ops: 2")
    lines.append(f"    anchor: {c.anchor}" if c.anchor else f"    op: fused.{c.name}")
    lines += [
        f"    category: {c.category}",
        f"    kernel: {q(f'drafted: {c.module_class} as one kernel (name the real one)')}",
        "    reference: zrt fusion discover",
    ]
    return lines


def discover(graphs: Mapping[str, OpGraph], packs: Iterable[FusionRulePack], platform: str,
             *, model: str = "model", name: str | None = None,
             max_parent_ops: int = MAX_PARENT_OPS) -> Discovery:
    """Draft a pack for ``graphs`` on ``platform``, marking what the packs of that platform
    (:func:`packs_for_platform` of ``packs``) already fuse. The pack is named
    ``discovered-NAME`` (``name`` defaults to ``model``), kept apart from ``packs``' names."""
    packs = list(packs)
    chosen = packs_for_platform(platform, packs)
    found = candidates(graphs, chosen, max_parent_ops)
    taken = {p.name for p in packs}
    label = re.sub(r"[^A-Za-z0-9_.\-]+", "-", name or model).strip("-").lower()
    base = f"discovered-{label or 'model'}"
    name, k = base, 2
    while name in taken:
        name, k = f"{base}-{k}", k + 1
    return Discovery(model=model, platform=platform, candidates=found, pack_name=name,
                     covered_packs=[p.name for p in chosen])


def discover_model(model: Any, host: PluginHost, platform: str, *,
                   seq_len: int = DISCOVERY_SEQ_LEN, label: str | None = None) -> Discovery:
    """Capture ``model``'s four phases (one layer per kind, batch 1) and draft its pack."""
    from zrt_core.capture.api import capture

    result = capture(model, batch=1, seq_len=seq_len, host=host)
    return discover(result.graphs, host.fusion_rules, platform,
                    model=label or str(result.model), name=str(result.model))
