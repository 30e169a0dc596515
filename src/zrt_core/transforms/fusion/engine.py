"""The fusion engine: finds each rule's matches in its scope (sequence or connected) and replaces
them by one fused node with the members' FLOPs, bytes and dataflow.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from attrs import evolve

from zrt_core.ir.graph import OpGraph, OpNode, TensorMeta
from zrt_core.transforms.fusion.rules import FusionRule, FusionRulePack, OpToken, Scope
from zrt_core.transforms.fusion.units import _Group, _is_alias, _Unit

if TYPE_CHECKING:
    pass


class _Engine:
    def __init__(self, graph: OpGraph) -> None:
        self.graph = graph
        nodes = self.nodes = graph.nodes
        n = len(nodes)
        self.pos = {node.id: i for i, node in enumerate(nodes)}
        self.succ: list[list[int]] = [[] for _ in range(n)]
        self.pred: list[list[int]] = [[] for _ in range(n)]
        pos = self.pos
        for a, b in graph.edges:
            pa, pb = pos.get(a), pos.get(b)
            if pa is None or pb is None:
                continue
            self.succ[pa].append(pb)
            self.pred[pb].append(pa)
        # tensor id -> positions reading it
        self.consumers: dict[int, list[int]] = {}
        self.path_nodes: dict[str, list[int]] = {}
        self.path_classes: dict[str, dict[str, None]] = {}
        # per node, per input: the position of the node that last wrote it before, or None
        self.in_prod: list[tuple[int | None, ...]] = []
        last: dict[int, int] = {}
        for i, node in enumerate(nodes):
            sources: list[int | None] = []
            for t in node.inputs:
                tid = t.tensor_id
                if tid is not None:
                    self.consumers.setdefault(tid, []).append(i)
                    sources.append(last.get(tid))
                else:
                    sources.append(None)
            self.in_prod.append(tuple(sources))
            for t in node.outputs:
                if t.tensor_id is not None:
                    last[t.tensor_id] = i
            self.path_nodes.setdefault(node.module_path, []).append(i)
            self.path_classes.setdefault(node.module_path, {})[node.module_class] = None
        self.sorted_paths = sorted(self.path_nodes)
        self.owner = [-1] * n
        self.groups: list[_Group] = []
        self._token_cache: dict[tuple[int, str, str, bool], bool] = {}
        self._any_cache: dict[tuple[int, str, str, bool], bool] = {}
        self._instances: dict[Scope, list[tuple[str, str, list[int]]]] = {}
        self._sizes: dict[tuple[tuple[int, ...], str], int] = {}
        # layer index -> (representative layer, its positions, this layer's positions)
        self.replica_of: dict[int, tuple[int, list[int], list[int]]] = {}
        self.hidden: set[int] = set()

    # -- layers matched once ------------------------------------------------------------

    def plan_replicas(self) -> None:
        """Match each distinct decoder layer once. A layer whose signature (ops, relative
        module paths, classes and in-layer dataflow) equals an earlier layer's of the same
        kind is hidden from the rules and receives that layer's fusions afterwards — a
        full-depth capture of 32 identical layers is matched like one."""
        by_layer: dict[int, list[int]] = {}
        kinds: dict[int, str | None] = {}
        for i, node in enumerate(self.nodes):
            if node.layer_index is not None:
                by_layer.setdefault(node.layer_index, []).append(i)
                kinds.setdefault(node.layer_index, node.layer_kind)
        per_kind: dict[str | None, list[int]] = {}
        for layer, kind in kinds.items():
            per_kind.setdefault(kind, []).append(layer)
        for layers in per_kind.values():
            if len(layers) < 2:
                continue
            seen: dict[tuple[Any, ...], int] = {}
            for layer in layers:
                signature = self._layer_signature(layer, by_layer[layer])
                rep = seen.setdefault(signature, layer)
                if rep != layer:
                    self.replica_of[layer] = (rep, by_layer[rep], by_layer[layer])
                    self.hidden.update(by_layer[layer])

    def _layer_signature(self, layer: int, positions: list[int]) -> tuple[Any, ...]:
        ordinal = {p: k for k, p in enumerate(positions)}
        outside: dict[int, int] = {}
        paths: dict[str, tuple[str, ...]] = {}
        parts: list[Any] = []
        nodes, pred, succ = self.nodes, self.pred, self.succ
        for p in positions:
            node = nodes[p]
            rel = paths.get(node.module_path)
            if rel is None:
                rel = paths[node.module_path] = _relative_path(node.module_path, layer)
            inputs: list[Any] = []
            for t, q in zip(node.inputs, self.in_prod[p], strict=True):
                tid = t.tensor_id
                if tid is None:
                    inputs.append(None)
                    continue
                k = ordinal.get(q) if q is not None else None
                if k is not None:
                    inputs.append(k)
                elif t.param is not None:
                    inputs.append("p")
                else:
                    x = outside.get(tid)
                    if x is None:
                        x = outside[tid] = len(outside)
                    inputs.append(-1 - x)
            preds = pred[p]
            inner = tuple(ordinal[q] for q in preds if q in ordinal)
            after = succ[p]
            parts.append((
                node.op, node.category, node.zero_cost, bool(node.fused_from), rel,
                node.module_class, tuple(inputs), inner, len(inner) != len(preds),
                any(q not in ordinal for q in after), not after,
            ))
        return tuple(parts)

    def replicate(self) -> None:
        """Copy each fusion of a representative layer onto the layers that match it."""
        if not self.replica_of:
            return
        replicas: dict[int, list[int]] = {}
        for layer, (rep, _, _) in self.replica_of.items():
            replicas.setdefault(rep, []).append(layer)
        nodes = self.nodes
        ordinals: dict[int, dict[int, int]] = {}
        for group in [g for g in self.groups if g.alive]:
            rep = nodes[group.members[0]].layer_index
            if rep not in replicas:
                continue
            for layer in replicas[rep]:
                _, rep_positions, positions = self.replica_of[layer]
                index = ordinals.get(rep)
                if index is None:
                    index = ordinals[rep] = {p: k for k, p in enumerate(rep_positions)}
                if any(p not in index for p in group.members):
                    break
                mapped = [positions[index[p]] for p in group.members]
                if any(self.owner[p] >= 0 for p in mapped):
                    continue
                anchor = (positions[index[group.anchor]] if group.anchor is not None
                          else None)
                copy = _Group(group.pack, group.rule, mapped,
                              _layer_path(group.path, rep, layer), group.cls, group.op,
                              anchor)
                number = len(self.groups)
                for p in mapped:
                    self.owner[p] = number
                self.groups.append(copy)

    # -- helpers ------------------------------------------------------------------------

    def nbytes(self, t: TensorMeta) -> int:
        key = (t.shape, t.dtype)
        size = self._sizes.get(key)
        if size is None:
            size = self._sizes[key] = t.nbytes
        return size

    def token_matches(self, token: OpToken, unit: _Unit) -> bool:
        key = (id(token), unit.op, unit.category, unit.fused)
        hit = self._token_cache.get(key)
        if hit is None:
            hit = self._token_cache[key] = token.matches(unit.op, unit.category, unit.fused)
        return hit

    def any_token(self, tokens: tuple[OpToken, ...], unit: _Unit) -> bool:
        key = (id(tokens), unit.op, unit.category, unit.fused)
        hit = self._any_cache.get(key)
        if hit is None:
            hit = self._any_cache[key] = any(
                t.matches(unit.op, unit.category, unit.fused) for t in tokens)
        return hit

    def subtree_paths(self, path: str) -> list[str]:
        """``path`` and every module path below it (a contiguous block when sorted)."""
        paths = self.sorted_paths
        out = [path] if path in self.path_nodes else []
        prefix = f"{path}." if path else ""
        k = bisect.bisect_left(paths, prefix)
        while k < len(paths) and paths[k].startswith(prefix):
            if paths[k] != path:
                out.append(paths[k])
            k += 1
        return out

    # -- instances ----------------------------------------------------------------------

    def instances(self, scope: Scope) -> list[tuple[str, str, list[int]]]:
        """``(path, class, positions)`` of every instance, each node in its innermost one
        (the graph's module tree does not change, so this is computed once per scope)."""
        hit = self._instances.get(scope)
        if hit is None:
            hit = self._instances[scope] = self._find_instances(scope)
        return hit

    def _find_instances(self, scope: Scope) -> list[tuple[str, str, list[int]]]:
        matching: dict[str, bool] = {}
        found: dict[str, str] = {}
        for path, classes in self.path_classes.items():
            if scope.module_path and not scope.path_matches(path):
                continue
            if scope.module_class:
                cls = None
                for c in classes:
                    ok = matching.get(c)
                    if ok is None:
                        ok = matching[c] = scope.class_matches(c)
                    if ok:
                        cls = c
                        break
                if cls is None:
                    continue
            else:
                cls = next(iter(classes))
            found[path] = cls
        if not found:
            return []
        if not scope.descendants:
            out = [(p, c, self.path_nodes[p]) for p, c in found.items()]
        else:
            owner_of: dict[str, str] = {}
            for path in sorted(found, key=len):  # outer first, inner overrides
                for sub in self.subtree_paths(path):
                    owner_of[sub] = path
            members: dict[str, list[int]] = {p: [] for p in found}
            for sub, inst in owner_of.items():
                members[inst].extend(self.path_nodes[sub])
            out = [(p, c, sorted(members[p])) for p, c in found.items() if members[p]]
        if self.hidden:  # layers that copy a representative's matches
            out = [(p, c, kept) for p, c, pos in out
                   if (kept := [q for q in pos if q not in self.hidden])]
        out.sort(key=lambda item: item[2][0])
        return out

    def in_instance(self, path: str, inst_path: str, descendants: bool) -> bool:
        if path == inst_path:
            return True
        return descendants and (inst_path == "" or path.startswith(inst_path + "."))

    def units(self, positions: list[int], inst_path: str, descendants: bool) -> list[_Unit]:
        out: list[_Unit] = []
        seen_groups: set[int] = set()
        nodes = self.nodes
        for p in positions:
            g = self.owner[p]
            if g >= 0:
                if g in seen_groups:
                    continue
                seen_groups.add(g)
                group = self.groups[g]
                if self.in_instance(group.path, inst_path, descendants):
                    out.append(_Unit(group.op, group.rule.category, group.members, g, True))
                else:  # fused at an outer scope: a barrier
                    out.append(_Unit("", "", group.members, g, True))
                continue
            node = nodes[p]
            if node.zero_cost:
                continue
            out.append(_Unit(node.op, node.category, [p], -1, bool(node.fused_from)))
        return out

    # -- matching -----------------------------------------------------------------------

    def apply_rule(self, pack: FusionRulePack, rule: FusionRule) -> None:
        for path, cls, positions in self.instances(rule.scope):
            units = self.units(positions, path, rule.scope.descendants)
            if not units:
                continue
            scope_set = set(positions)
            if rule.match == "sequence":
                self.match_sequence(pack, rule, path, cls, units, scope_set)
            else:
                self.match_connected(pack, rule, path, cls, units, scope_set)

    def _sequence_candidates(self, tokens: tuple[OpToken, ...], units: list[_Unit], ui: int,
                             ti: int = 0, acc: tuple[int, ...] = ()) -> Iterator[list[int]]:
        """Unit indices matching ``tokens`` from ``ui``, greedy alternatives first (a method
        calling itself: a closure doing so is a cycle only the cyclic collector frees)."""
        if ti == len(tokens):
            yield list(acc)
            return
        n = len(units)
        tok = tokens[ti]
        if tok.quantifier in ("", "?"):
            if ui < n and self.token_matches(tok, units[ui]):
                yield from self._sequence_candidates(tokens, units, ui + 1, ti + 1, (*acc, ui))
            if tok.quantifier == "?":
                yield from self._sequence_candidates(tokens, units, ui, ti + 1, acc)
            return
        k = ui
        while k < n and self.token_matches(tok, units[k]):
            k += 1
        least = ui + (1 if tok.quantifier == "+" else 0)
        for end in range(k, least - 1, -1):
            yield from self._sequence_candidates(tokens, units, end, ti + 1,
                                                 (*acc, *range(ui, end)))

    def match_sequence(self, pack: FusionRulePack, rule: FusionRule, path: str, cls: str,
                       units: list[_Unit], scope_set: set[int]) -> None:
        i = 0
        while i < len(units):
            if not self.token_matches(rule.ops[0], units[i]) and rule.ops[0].quantifier == "":
                i += 1
                continue
            accepted = None
            for cand in self._sequence_candidates(rule.ops, units, i):
                if not cand:
                    continue
                chosen = [units[k] for k in cand]
                if self.connected(chosen, scope_set) and self.try_fuse(
                        pack, rule, path, cls, chosen, scope_set):
                    accepted = cand
                    break
            i = accepted[-1] + 1 if accepted else i + 1

    def match_connected(self, pack: FusionRulePack, rule: FusionRule, path: str, cls: str,
                        units: list[_Unit], scope_set: set[int]) -> None:
        candidates = [u for u in units if self.any_token(rule.ops, u)]
        for component in self.components(candidates, scope_set):
            self._fuse_component(pack, rule, path, cls, component, scope_set)

    def _fuse_component(self, pack: FusionRulePack, rule: FusionRule, path: str, cls: str,
                        component: list[_Unit], scope_set: set[int]) -> None:
        if not self.satisfies(rule, component):
            return
        if self.try_fuse(pack, rule, path, cls, component, scope_set):
            return
        # Not convex (or spans layers): keep the longest convex prefix, retry the rest.
        component = sorted(component, key=lambda u: u.positions[0])
        for cut in range(len(component) - 1, 0, -1):
            head = component[:cut]
            if not self.satisfies(rule, head) or not self.connected(head, scope_set):
                continue
            if self.try_fuse(pack, rule, path, cls, head, scope_set):
                for part in self.components(component[cut:], scope_set):
                    self._fuse_component(pack, rule, path, cls, part, scope_set)
                return

    def satisfies(self, rule: FusionRule, units: list[_Unit]) -> bool:
        for tok in rule.requires:
            if not any(self.token_matches(tok, u) for u in units):
                return False
        return sum(1 for u in units for p in u.positions
                   if not self.nodes[p].zero_cost) >= rule.min_ops

    # -- connectivity -------------------------------------------------------------------

    def _links(self, units: list[_Unit], scope_set: set[int]) -> list[tuple[int, int]]:
        """Pairs of unit indices linked by dataflow (through unfused in-scope views) or by
        reading the same non-parameter tensor."""
        unit_of: dict[int, int] = {}
        for k, u in enumerate(units):
            for p in u.positions:
                unit_of[p] = k
        links: list[tuple[int, int]] = []
        readers: dict[int, int] = {}
        nodes = self.nodes
        in_prod = self.in_prod
        for k, u in enumerate(units):
            for p in u.positions:
                for t, source in zip(nodes[p].inputs, in_prod[p], strict=True):
                    tid = t.tensor_id
                    if tid is None or t.param is not None:
                        continue
                    q = source
                    while q is not None:
                        other = unit_of.get(q)
                        if other is not None:
                            if other != k:
                                links.append((other, k))
                            tid = None
                            break
                        node_q = nodes[q]
                        if (self.owner[q] < 0 and q in scope_set and _is_alias(node_q)
                                and node_q.inputs and node_q.inputs[0].tensor_id is not None
                                and node_q.inputs[0].param is None):
                            tid, q = node_q.inputs[0].tensor_id, in_prod[q][0]
                            continue
                        break
                    if tid is not None:
                        first = readers.setdefault(tid, k)
                        if first != k:
                            links.append((first, k))
        return links

    def components(self, units: list[_Unit], scope_set: set[int]) -> list[list[_Unit]]:
        parent = list(range(len(units)))

        def find(x: int) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for a, b in self._links(units, scope_set):
            ra, rb = find(a), find(b)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
        comps: dict[int, list[_Unit]] = {}
        for k, u in enumerate(units):
            comps.setdefault(find(k), []).append(u)
        return sorted(comps.values(), key=lambda c: c[0].positions[0])

    def connected(self, units: list[_Unit], scope_set: set[int]) -> bool:
        return len(units) <= 1 or len(self.components(units, scope_set)) == 1

    # -- building a region ----------------------------------------------------------------

    def absorb_views(self, members: set[int], scope_set: set[int]) -> list[int]:
        """Unfused zero-cost nodes of the scope that only serve the region: those whose
        every consumer is in it (a transpose feeding a member), and chains hanging off a
        member that no node outside reads (the detach autograd keeps of a member's output).
        """
        nodes, owner, succ, pred = self.nodes, self.owner, self.succ, self.pred
        free = {p for p in scope_set if owner[p] < 0 and nodes[p].zero_cost
                and p not in members}
        if not free:
            return []
        taken: list[int] = []
        changed = True
        while changed:
            changed = False
            for p in sorted(free, reverse=True):
                if succ[p] and all(s in members for s in succ[p]):
                    members.add(p)
                    free.discard(p)
                    taken.append(p)
                    changed = True
        trailing: dict[int, bool] = {}
        for p in sorted(free):
            if p in members or not pred[p] or not all(q in members for q in pred[p]):
                continue
            if _hangs(p, free, succ, trailing):
                stack = [p]
                while stack:
                    q = stack.pop()
                    if q not in members:
                        members.add(q)
                        taken.append(q)
                        stack.extend(succ[q])
        return taken

    def convex(self, members: set[int]) -> bool:
        """No path leaves the region and comes back (the fused node would be a cycle)."""
        first, last = min(members), max(members)
        tainted: set[int] = set()
        pred, owner, groups = self.pred, self.owner, self.groups
        for p in range(first, last + 1):
            if p in members:
                if any(q in tainted for q in pred[p]):
                    return False
                continue
            if any(q in members or q in tainted for q in pred[p]):
                tainted.add(p)
                g = owner[p]
                if g >= 0:
                    tainted.update(groups[g].members)
        return True

    def try_fuse(self, pack: FusionRulePack, rule: FusionRule, path: str, cls: str,
                 units: list[_Unit], scope_set: set[int]) -> bool:
        if not self.satisfies(rule, units):
            return False
        members: set[int] = set()
        for u in units:
            members.update(u.positions)
        layers = {self.nodes[p].layer_index for p in members}
        if len(layers) > 1:
            return False
        self.absorb_views(members, scope_set)
        if not self.convex(members):
            return False
        anchor = None
        if rule.anchor is not None:
            for p in sorted(members):
                node = self.nodes[p]
                if self.owner[p] < 0 and rule.anchor.matches(node.op, node.category, False):
                    anchor = p
                    break
            if anchor is None:
                return False
        op = rule.op if rule.op is not None else self.nodes[anchor].op  # type: ignore[index]
        index = len(self.groups)
        group = _Group(pack, rule, sorted(members), path, cls, op, anchor)
        for u in units:
            if u.group >= 0:
                self.groups[u.group].alive = False
        for p in members:
            self.owner[p] = index
        self.groups.append(group)
        return True

    # -- the result ---------------------------------------------------------------------

    def result(self, pack_names: list[str]) -> OpGraph:
        graph = self.graph
        if not any(g.alive for g in self.groups):
            return graph
        while True:
            order = self._topological()
            if order is not None:
                break
        nodes = self.nodes
        groups = len(self.groups)
        next_id = _max_id(nodes) + 1
        new_nodes: list[OpNode] = []
        unit_id: dict[int, int] = {}
        counts: dict[str, int] = {}
        for k in order:
            if k >= groups:
                node = nodes[k - groups]
                new_nodes.append(node)
                unit_id[k] = node.id
                continue
            group = self.groups[k]
            fused = self._fused_node(group, next_id)
            unit_id[k] = next_id
            next_id += 1
            new_nodes.append(fused)
            key = f"{group.pack.name}/{group.rule.name}"
            counts[key] = counts.get(key, 0) + 1
        edges: dict[tuple[int, int], None] = {}
        pos = self.pos
        for a, b in graph.edges:
            pa, pb = pos.get(a), pos.get(b)
            if pa is None or pb is None:
                continue
            ua, ub = self._unit_key(pa), self._unit_key(pb)
            if ua != ub:
                edges[(unit_id[ua], unit_id[ub])] = None
        previous = graph.meta.get("fusion") or {}
        fused_counts = dict(previous.get("fused", {}))
        for key, count in counts.items():
            fused_counts[key] = fused_counts.get(key, 0) + count
        summary = {
            "packs": list(dict.fromkeys((*previous.get("packs", ()), *pack_names))),
            "fused": fused_counts,
            "nodes_before": previous.get("nodes_before", len(nodes)),
            "nodes_after": len(new_nodes),
        }
        return evolve(graph, nodes=new_nodes, edges=list(edges),
                      meta={**graph.meta, "fusion": summary})

    def _unit_key(self, p: int) -> int:
        """A unit's number: its group's index, or the group count plus its position."""
        g = self.owner[p]
        return g if g >= 0 else len(self.groups) + p

    def _topological(self) -> list[int] | None:
        """Unit numbers in dependency order, each as early as its first member ran; on a
        cycle (two regions that reach each other) the later region is dissolved and None
        is returned so the caller retries."""
        n = len(self.nodes)
        unit = [self._unit_key(p) for p in range(n)]
        first: dict[int, int] = {}
        for p in range(n):
            first.setdefault(unit[p], p)
        indegree = dict.fromkeys(first, 0)
        out_edges: dict[int, list[int]] = {k: [] for k in first}
        seen: set[tuple[int, int]] = set()
        succ = self.succ
        for pa in range(n):
            ua = unit[pa]
            for pb in succ[pa]:
                ub = unit[pb]
                if ua != ub and (ua, ub) not in seen:
                    seen.add((ua, ub))
                    out_edges[ua].append(ub)
                    indegree[ub] += 1
        heap = [(first[k], k) for k, d in indegree.items() if d == 0]
        heapq.heapify(heap)
        order: list[int] = []
        while heap:
            _, k = heapq.heappop(heap)
            order.append(k)
            for nxt in out_edges[k]:
                indegree[nxt] -= 1
                if indegree[nxt] == 0:
                    heapq.heappush(heap, (first[nxt], nxt))
        if len(order) == len(first):
            return order
        groups = len(self.groups)
        stuck = [k for k, d in indegree.items() if d > 0 and k < groups]
        victim = max(stuck) if stuck else max(i for i, g in enumerate(self.groups) if g.alive)
        self.groups[victim].alive = False
        for p in self.groups[victim].members:
            if self.owner[p] == victim:
                self.owner[p] = -1
        return None

    # -- the fused node -------------------------------------------------------------------

    def _resolve(self, position: int, index: int, members: set[int]) -> tuple[int, bool]:
        """``(base id, produced inside)`` of input ``index`` of the member at ``position``,
        through the region's aliases (absorbed views) back to a member that computed it or
        an outside tensor."""
        nodes, in_prod = self.nodes, self.in_prod
        tensor_id = nodes[position].inputs[index].tensor_id
        assert tensor_id is not None
        q = in_prod[position][index]
        while True:
            if q is None or q not in members:
                return tensor_id, False
            node = nodes[q]
            if _is_alias(node) and node.inputs and node.inputs[0].tensor_id is not None:
                tensor_id, q = node.inputs[0].tensor_id, in_prod[q][0]
                continue
            return tensor_id, True

    def _escapes(self, tensor_id: int, producer: int, members: set[int], depth: int = 0) -> bool:
        """Whether a member's output is needed outside: read by a node outside, read by no
        node at all (a graph result), or aliased by an absorbed view that escapes."""
        readers = [c for c in self.consumers.get(tensor_id, ()) if c > producer]
        if not readers:
            return True
        nodes = self.nodes
        for c in readers:
            if c not in members:
                return True
            node = nodes[c]
            if _is_alias(node) and depth < 64:
                for t in node.outputs:
                    if t.tensor_id is not None and self._escapes(t.tensor_id, c, members,
                                                                 depth + 1):
                        return True
        return False

    def _fused_node(self, group: _Group, new_id: int) -> OpNode:
        nodes = self.nodes
        member_set = set(group.members)
        members = [nodes[p] for p in group.members]
        read = written = flops = 0
        # outside tensor (through the region's views) -> {tensor read: bytes}; all reads
        outside_reads: dict[int, dict[int, int]] = {}
        outside_total: dict[int, int] = {}
        outside_meta: dict[int, TensorMeta] = {}
        loose_inputs: list[TensorMeta] = []
        written_ids: set[int] = set()
        boundary_outputs: dict[int, TensorMeta] = {}
        formula_ok = True
        for p in group.members:
            node = nodes[p]
            flops += node.flops
            if node.zero_cost:
                continue
            if node.formula is None:
                formula_ok = False
            inside_read = 0
            for j, t in enumerate(node.inputs):
                if t.tensor_id is None:
                    loose_inputs.append(t)
                    continue
                base, inside = self._resolve(p, j, member_set)
                if inside:
                    inside_read += self.nbytes(t)
                    continue
                if base not in outside_meta:
                    outside_meta[base] = self._outside_meta(base, p, j, member_set)
                    outside_reads[base] = {}
                    outside_total[base] = 0
                outside_reads[base][t.tensor_id] = self.nbytes(t)
                outside_total[base] += self.nbytes(t)
            inside_write = 0
            for t in node.outputs:
                if t.tensor_id is None or t.is_view:
                    continue
                if not self._escapes(t.tensor_id, p, member_set):
                    inside_write += self.nbytes(t)
                elif t.tensor_id in written_ids:  # an in-place member writes it again
                    inside_write += self.nbytes(t)
                else:
                    written_ids.add(t.tensor_id)
                    boundary_outputs[t.tensor_id] = t
            read += max(0, node.bytes_read - inside_read)
            written += max(0, node.bytes_written - inside_write)
        # An outside tensor is read once: the distinct views of it the members read (both
        # halves of a split, a slice and the whole), at most its own size.
        for base, views in outside_reads.items():
            once = min(self.nbytes(outside_meta[base]), sum(views.values()))
            read -= outside_total[base] - once
        read = max(0, read)

        inputs: list[TensorMeta] = []
        outputs: list[TensorMeta] = []
        anchor = nodes[group.anchor] if group.anchor is not None else None
        if anchor is not None:
            listed: set[int] = set()
            for j, t in enumerate(anchor.inputs):
                if t.tensor_id is None:
                    inputs.append(t)
                    continue
                base, inside = self._resolve(group.anchor, j, member_set)
                if inside:
                    inputs.append(evolve(t, tensor_id=None))
                else:
                    inputs.append(outside_meta.get(base, t))
                    listed.add(base)
            inputs.extend(m for b, m in outside_meta.items() if b not in listed)
            inputs.extend(t for t in loose_inputs if t not in anchor.inputs)
            for t in anchor.outputs:
                outputs.append(t if t.tensor_id in boundary_outputs
                               else evolve(t, tensor_id=None))
            anchor_out = {t.tensor_id for t in anchor.outputs}
            outputs.extend(t for tid, t in boundary_outputs.items() if tid not in anchor_out)
        else:
            inputs = [*outside_meta.values(), *loose_inputs]
            outputs = list(boundary_outputs.values())

        attrs: dict[str, Any] = dict(anchor.attrs) if anchor is not None else {}
        for key in ("seq_nr", "fwd_seq_nr"):
            values = sorted({m.attrs[key] for m in members if key in m.attrs})
            if values:
                attrs[key] = anchor.attrs.get(key, values[0]) if anchor is not None \
                    else values[0]
                attrs[f"{key}s"] = values
        attrs["fusion_rule"] = f"{group.pack.name}/{group.rule.name}"
        attrs["kernel"] = group.rule.kernel
        first = members[0]
        layer_node = next((m for m in members if not m.zero_cost), first)
        flattened: list[OpNode] = list(members)
        return OpNode(
            id=new_id, op=group.op, category=group.rule.category, phase=self.graph.phase,
            inputs=inputs, outputs=outputs, module_path=group.path, module_class=group.cls,
            layer_index=layer_node.layer_index, layer_kind=layer_node.layer_kind,
            flops=flops, bytes_read=read, bytes_written=written,
            formula="fusion" if formula_ok else None, zero_cost=False, attrs=attrs,
            fused_from=flattened,
        )

    def _outside_meta(self, base: int, position: int, index: int,
                      members: set[int]) -> TensorMeta:
        """The outside tensor ``base`` that input ``index`` of a member reads (through the
        region's views)."""
        read = self.nodes[position].inputs[index]
        q = self.in_prod[position][index]
        while read.tensor_id != base and q is not None and q in members:
            read, q = self.nodes[q].inputs[0], self.in_prod[q][0]
        return read


def _relative_path(path: str, layer: int) -> tuple[str, ...]:
    """A module path relative to its decoder layer: ``("model.layers", "mlp.up_proj")``
    for ``model.layers.7.mlp.up_proj`` in layer 7; the whole path when it has no segment
    naming the layer."""
    parts = path.split(".")
    name = str(layer)
    for i, part in enumerate(parts):
        if part == name:
            return (".".join(parts[:i]), ".".join(parts[i + 1:]))
    return (path,)


def _layer_path(path: str, rep: int, layer: int) -> str:
    """``path`` of layer ``rep`` as the same module of ``layer``."""
    rel = _relative_path(path, rep)
    if len(rel) == 1:
        return path
    prefix, rest = rel
    head = f"{prefix}.{layer}" if prefix else str(layer)
    return f"{head}.{rest}" if rest else head


def _max_id(nodes: Sequence[OpNode]) -> int:
    best = -1
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if node.id > best:
            best = node.id
        stack.extend(node.fused_from)
    return best


def _hangs(p: int, free: set[int], succ: list[list[int]], trailing: dict[int, bool]) -> bool:
    """``p`` and everything below it are free views read by nothing outside (memoised)."""
    hit = trailing.get(p)
    if hit is None:
        trailing[p] = False  # guards a cycle (none in a DAG)
        hit = p in free and all(_hangs(s, free, succ, trailing) for s in succ[p])
        trailing[p] = hit
    return hit
