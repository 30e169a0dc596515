"""Fusion rules and packs: op-pattern tokens, module scopes, ``FusionRule`` and
``FusionRulePack`` read strictly from YAML, and the packs of a platform.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrs import field, frozen

from zrt_core._data import Fields, load_yaml
from zrt_core.errors import SpecError
from zrt_core.ir.graph import Category, Phase

if TYPE_CHECKING:
    pass


#: The platforms a pack may target; ``generic`` packs apply on every platform.
PLATFORMS = ("cuda", "ascend", "generic")

#: Phase groups a rule's ``phases`` may name besides the phases themselves.
PHASE_GROUPS: Mapping[str, tuple[str, ...]] = {
    "forward": (Phase.PREFILL, Phase.DECODE, Phase.TRAIN_FORWARD),
    "backward": (Phase.TRAIN_BACKWARD,),
    "inference": (Phase.PREFILL, Phase.DECODE),
    "training": (Phase.TRAIN_FORWARD, Phase.TRAIN_BACKWARD),
    "all": Phase.ALL,
}

MATCH_MODES = ("sequence", "connected")

_CATEGORY_PREFIX = "category:"
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
_OP_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)+$")


# -- patterns ---------------------------------------------------------------------------


@frozen
class OpToken:
    """One element of an op pattern: alternatives (``aten.silu|aten.gelu``), each an op
    name (any overload: ``aten.mul`` matches ``aten.mul.Tensor``) or ``category:NAME``,
    with an optional quantifier (``?``, ``*``, ``+``; sequences only).

    A fused node matches only a token naming its op exactly; categories never match one,
    so a pack cannot fuse a kernel twice by accident.
    """

    alternatives: tuple[str, ...] = field(converter=tuple)
    quantifier: str = ""

    @property
    def text(self) -> str:
        return "|".join(self.alternatives) + self.quantifier

    @classmethod
    def parse(cls, text: Any, where: str, *, quantifiers: bool) -> OpToken:
        """Parse ``"aten.mul|category:elementwise+"``; a bad token names ``where``."""
        if not isinstance(text, str) or not text.strip():
            raise SpecError(f"{where} must be an op name or category:NAME, got {text!r}")
        body = text.strip()
        quantifier = ""
        if body[-1] in "?*+":
            quantifier, body = body[-1], body[:-1]
            if not quantifiers:
                raise SpecError(f"{where}: {text!r} has a quantifier {quantifier!r}",
                                "quantifiers belong to match: sequence patterns only")
        alternatives = tuple(a.strip() for a in body.split("|"))
        for alt in alternatives:
            if alt.startswith(_CATEGORY_PREFIX):
                category = alt[len(_CATEGORY_PREFIX):]
                if category not in Category.ALL:
                    raise SpecError(f"{where}: unknown category {category!r} in {text!r}",
                                    f"use one of {', '.join(Category.ALL)}")
            elif not _OP_RE.match(alt):
                raise SpecError(
                    f"{where}: {alt!r} in {text!r} is not an op name",
                    "write namespace.name (aten.mul, zrt.attention) or category:NAME")
        return cls(alternatives, quantifier)

    def matches(self, op: str, category: str, fused: bool) -> bool:
        for alt in self.alternatives:
            if alt.startswith(_CATEGORY_PREFIX):
                if not fused and category == alt[len(_CATEGORY_PREFIX):]:
                    return True
            elif op == alt or (not fused and op.startswith(alt + ".")):
                return True
        return False


@frozen
class Scope:
    """Where a rule looks: module instances whose class or path matches a glob.

    :param module_class: class-name globs (``*RMSNorm``); a path whose nodes carry a
        matching class is an instance.
    :param module_path: module-path globs (``model.layers.*.mlp``).
    :param descendants: include the nodes of sub-modules (``mlp.act_fn`` under ``mlp``);
        a node belongs to its innermost instance.
    """

    module_class: tuple[str, ...] = field(default=(), converter=tuple)
    module_path: tuple[str, ...] = field(default=(), converter=tuple)
    descendants: bool = False

    def class_matches(self, cls: str) -> bool:
        return any(fnmatch.fnmatchcase(cls, p) for p in self.module_class)

    def path_matches(self, path: str) -> bool:
        return any(fnmatch.fnmatchcase(path, p) for p in self.module_path)


@frozen
class FusionRule:
    """One fusion: ops matching ``ops`` inside one instance of ``scope`` → one node.

    :param name: unique within its pack.
    :param scope: the module instances the pattern is matched in.
    :param ops: the pattern (a sequence, or the allowed set for ``connected``).
    :param match: ``sequence`` or ``connected``.
    :param phases: the graph phases the rule applies to.
    :param kernel: the platform kernel the fused node stands for (recorded in its attrs).
    :param category: the :class:`Category` of the fused node.
    :param op: the fused node's op name; None keeps the anchor's op (so shape readers such
        as the attention and GEMM pricing read the node as before).
    :param anchor: the member whose attrs (and input/output order) the fused node keeps.
    :param requires: tokens that must each match a member (``connected``).
    :param min_ops: fewest non-view members a match needs.
    :param reference: where the kernel is documented.
    """

    name: str
    scope: Scope
    ops: tuple[OpToken, ...] = field(converter=tuple)
    match: str
    phases: tuple[str, ...] = field(converter=tuple)
    kernel: str
    category: str
    op: str | None = None
    anchor: OpToken | None = None
    requires: tuple[OpToken, ...] = field(default=(), converter=tuple)
    min_ops: int = 1
    reference: str = ""
    description: str = ""

    _KEYS = frozenset({"name", "scope", "ops", "match", "phases", "kernel", "category", "op",
                       "anchor", "requires", "min_ops", "reference", "description"})

    @classmethod
    def from_mapping(cls, data: Any, where: str) -> FusionRule:
        """Read one rule; ``where`` (``"cuda.yaml: rules[3]"``) prefixes every error."""
        f = Fields(data, where, cls._KEYS)
        name = f.str("name", required=True)
        assert name is not None
        if not _NAME_RE.match(name):
            raise SpecError(f"{f.path('name')} must be a plain name, got {name!r}")
        match = f.str("match", "sequence")
        if match not in MATCH_MODES:
            raise SpecError(f"{f.path('match')} must be one of {', '.join(MATCH_MODES)}, "
                            f"got {match!r}")
        sequence = match == "sequence"
        raw_ops = f.list("ops")
        if not raw_ops:
            raise SpecError(f"{f.path('ops')} is required: a non-empty list of op tokens")
        ops = tuple(OpToken.parse(t, f"{f.path('ops')}[{i}]", quantifiers=sequence)
                    for i, t in enumerate(raw_ops))
        if sequence and all(t.quantifier in ("?", "*") for t in ops):
            raise SpecError(f"{f.path('ops')} can match nothing: every token is optional")
        requires = tuple(OpToken.parse(t, f"{f.path('requires')}[{i}]", quantifiers=False)
                         for i, t in enumerate(f.list("requires")))
        if requires and sequence:
            raise SpecError(f"{f.path('requires')} applies to match: connected only",
                            "a sequence already requires each of its tokens")
        anchor = None
        if f.has("anchor"):
            anchor = OpToken.parse(f.raw("anchor"), f.path("anchor"), quantifiers=False)
        op = f.str("op")
        if op is None and anchor is None:
            raise SpecError(f"{f.path('op')} is required (or an anchor whose op is kept)")
        if op is not None and not _OP_RE.match(op):
            raise SpecError(f"{f.path('op')} must look like namespace.name, got {op!r}")
        category = f.str("category", required=True)
        if category not in Category.ALL:
            raise SpecError(f"{f.path('category')}: unknown category {category!r}",
                            f"use one of {', '.join(Category.ALL)}")
        kernel = f.str("kernel", required=True)
        min_ops = f.integer("min_ops", 1, positive=True)
        return cls(
            name=name, scope=_scope(f, "scope"), ops=ops, match=match,
            phases=_phases(f, "phases"), kernel=str(kernel), category=str(category), op=op,
            anchor=anchor, requires=requires, min_ops=int(min_ops or 1),
            reference=f.str("reference", "") or "", description=f.str("description", "") or "",
        )


def _str_list(f: Fields, key: str) -> tuple[str, ...]:
    value = f.raw(key)
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) and v for v in items):
        raise SpecError(f"{f.path(key)} must be a glob or a list of globs, got {value!r}")
    return tuple(items)


def _scope(f: Fields, key: str) -> Scope:
    raw = f.raw(key)
    if raw is None:
        raise SpecError(f"{f.path(key)} is required: module_class and/or module_path globs")
    s = Fields(raw, f.path(key), {"module_class", "module_path", "descendants"})
    classes, paths = _str_list(s, "module_class"), _str_list(s, "module_path")
    if not classes and not paths:
        raise SpecError(f"{f.path(key)} needs module_class or module_path")
    descendants = s.raw("descendants", False)
    if not isinstance(descendants, bool):
        raise SpecError(f"{s.path('descendants')} must be true or false, got {descendants!r}")
    return Scope(module_class=classes, module_path=paths, descendants=descendants)


def _phases(f: Fields, key: str) -> tuple[str, ...]:
    raw = f.raw(key, ["forward"])
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not items:
        raise SpecError(f"{f.path(key)} must be a list of phases, got {raw!r}")
    out: list[str] = []
    for item in items:
        if item in PHASE_GROUPS:
            out.extend(PHASE_GROUPS[item])
        elif item in Phase.ALL:
            out.append(item)
        else:
            raise SpecError(f"{f.path(key)}: unknown phase {item!r}",
                            f"use {', '.join((*Phase.ALL, *PHASE_GROUPS))}")
    return tuple(dict.fromkeys(out))


@frozen
class FusionRulePack:
    """A named set of fusion rules for one platform (``cuda``, ``ascend``, ``generic``).

    Packs of a platform run in descending ``priority`` (then by name) before the generic
    packs; rules run in their listed order, each seeing the graph the previous left. A
    ``user`` pack (``--fusion-rules FILE``) runs ahead of every installed pack.
    """

    name: str
    platform: str
    rules: tuple[FusionRule, ...] = field(default=(), converter=tuple)
    source: str = ""
    priority: int = 0
    description: str = ""
    user: bool = False

    def __attrs_post_init__(self) -> None:
        if self.platform not in PLATFORMS:
            raise SpecError(f"fusion rule pack {self.name!r}: unknown platform "
                            f"{self.platform!r}", f"use one of {', '.join(PLATFORMS)}")
        seen: set[str] = set()
        for rule in self.rules:
            if not isinstance(rule, FusionRule):
                raise SpecError(f"fusion rule pack {self.name!r}: rules must be FusionRule "
                                f"values, got {type(rule).__name__}")
            if rule.name in seen:
                raise SpecError(f"fusion rule pack {self.name!r}: rule {rule.name!r} "
                                "appears twice")
            seen.add(rule.name)

    @classmethod
    def from_yaml(cls, path: str | Path, *, user: bool = False) -> FusionRulePack:
        """Load a pack; a bad key or value raises :class:`SpecError` naming the file, the
        field and the rule. A ``user`` pack is named by the path as given."""
        path = Path(path)
        return cls.from_mapping(load_yaml(path), source=str(path),
                                where=str(path) if user else path.name, user=user)

    @classmethod
    def from_mapping(cls, data: Any, *, source: str = "<mapping>",
                     where: str | None = None, user: bool = False) -> FusionRulePack:
        label = where or source
        top = Fields(data, f"{label}: ", {"name", "platform", "priority", "description",
                                          "rules"})
        name = top.str("name", required=True)
        platform = top.str("platform", required=True)
        if platform not in PLATFORMS:
            raise SpecError(f"{top.path('platform')}: unknown platform {platform!r}",
                            f"use one of {', '.join(PLATFORMS)}")
        raw_rules = top.list("rules")
        rules = []
        names: dict[str, int] = {}
        for i, raw in enumerate(raw_rules):
            try:
                rule = FusionRule.from_mapping(raw, f"{label}: rules[{i}]")
            except SpecError as exc:
                named = raw.get("name") if isinstance(raw, Mapping) else None
                if not isinstance(named, str):
                    raise
                raise SpecError(f"{exc.message} (rule {named!r})", exc.hint) from None
            if rule.name in names:
                raise SpecError(f"{label}: rules[{i}].name {rule.name!r} is also "
                                f"rules[{names[rule.name]}]", "rule names must be unique")
            names[rule.name] = i
            rules.append(rule)
        return cls(name=str(name), platform=str(platform), rules=rules, source=source,
                   priority=int(top.integer("priority", 0) or 0),
                   description=top.str("description", "") or "", user=user)


def packs_for_platform(platform: str, packs: Iterable[FusionRulePack]
                       ) -> tuple[FusionRulePack, ...]:
    """The packs that apply on ``platform``, in application order: the user's packs
    (``--fusion-rules``), then the installed ones; in each, the platform's own (descending
    priority, then name) before the generic ones (same order)."""
    if platform not in PLATFORMS:
        raise SpecError(f"unknown fusion platform {platform!r}",
                        f"use one of {', '.join(PLATFORMS)}")
    packs = list(packs)

    def ordered(plat: str, user: bool) -> list[FusionRulePack]:
        return sorted((p for p in packs if p.platform == plat and p.user == user),
                      key=lambda p: (-p.priority, p.name))

    plats = (platform, "generic") if platform != "generic" else ("generic",)
    return tuple(p for user in (True, False) for plat in plats for p in ordered(plat, user))
