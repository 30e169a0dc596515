"""Collectives priced on the N-tier interconnect: an α-β model per tier, NCCL-style.

A group of ``n`` ranks spread evenly over ``span`` consecutive ranks (``Parallel.span``) has
its members ``stride = span / n`` ranks apart. Tier ``i`` (innermost first, a domain of
``D_i`` devices) holds ``m_i = clamp(D_i // stride, 1, n)`` members of the group in one of
its domains; the group lives on the innermost tier whose domain holds all ``span`` ranks,
and the tiers where ``m_i > m_(i-1)`` are the ones its traffic crosses (``m_-1 = 1``).

Per tier: ``α_i`` = ``latency_us`` (one step's start-up), ``β_i`` = 1 / (``bandwidth_gb_per_s``
× ``efficiency``), where ``efficiency`` is the achievable NCCL *bus bandwidth* over the link
rate (nccl-tests' busbw). With ``S`` the message bytes per rank (docs/architecture.md):

ring all-reduce        2(n-1)/n · S / B_ring + Σ_i steps_i · α_i,   steps_i = 2(d_(i-1) - d_i)
ring all-gather,
ring reduce-scatter    (n-1)/n · S / B_ring + Σ_i (d_(i-1) - d_i) · α_i
    where d_i = n / m_i domains of tier i the group covers (d_-1 = n), and
    B_ring = min over crossed tiers of m_(i-1) · B_i: a ring leaves each tier-(i-1) domain
    once per channel and NCCL runs one channel per rail, so a domain's m_(i-1) links to the
    next tier work in parallel (DGX A100: min(300·0.78, 8 · 25·0.9) = 180 GB/s).
tree all-reduce        2 S / (0.9 · B_ring) + 2 · ((r_0 - 1) α_0 + Σ_(i≥1) ⌈log2 r_i⌉ α_i)
    NCCL's double binary tree between domains and a chain inside the innermost one
    (r_i = m_i / m_(i-1) members per step); 0.9 and the algorithm bandwidth of busBw/2 are
    NCCL's own tuning model (src/graph/tuning.cc).
hierarchical           per crossed tier i, inner to outer then back: a reduce-scatter and
                       an all-gather among r_i peers of S / m_(i-1) bytes each, each at
                       B_i = bandwidth_i · efficiency_i (the m_(i-1) rails run in parallel):
    all-reduce   Σ_i 2 (r_i-1)/r_i · S/m_(i-1) / B_i + 2 (r_i-1) α_i
    all-gather   Σ_i   (r_i-1)/r_i · S/m_(i-1) / B_i +   (r_i-1) α_i   (reduce-scatter alike)
all-to-all             each rank sends S/n to every member; what goes to the (m_i - m_(i-1))
                       members first reached at tier i crosses tier i, all tiers at once:
                       max_i ((m_i - m_(i-1))/n · S / A_i) + α of the outermost crossed tier,
                       A_i = bandwidth_i · all_to_all_efficiency_i (NCCL's all-to-all;
                       the tier's efficiency where it has none, and for dedup)
send/recv              S / B_top + α_top (the pipeline's slowest hop sets the pace)
broadcast              S / B_ring + (n-1) α (pipelined ring)

In-network reduction (where the pack's tiers say their switches reduce; docs/collectives.md):
nvls all-reduce        NVLink SHARP on the first crossed tier c (``nvls_efficiency`` e_c): each
                       device moves S each way (multimem reduce, then multicast), and across
                       further tiers SHARP (``sharp``) moves S / m_(i-1) per NIC each way,
                       the stages pipelined: max(S/(e_c B_c), max_i S/(m_(i-1) B_i)) + 25 µs
                       (+ 18 µs across the network) — NCCL's NVLS latencies (tuning.cc)
nvls all-gather,       one NVSwitch domain only: (n-1)/n · S / (e_c B_c) + 25 µs
nvls reduce-scatter
nvls_tree all-reduce   NVLS inside the domain, NCCL's double binary tree between domains:
                       max(S/(e_c B_c), max_i f_i S / (0.9 m_(i-1) B_i)) + 25 µs
                       + Σ_i 2 ⌈log2 r_i⌉ α_i; f_i = 2, or 1 between two domains (each is the
                       root of one tree and a leaf of the other)
collnet all-reduce     SHARP (CollNet Direct) on the outer tiers that have ``sharp``, the
                       tiers inside them as the hierarchical reduce-scatter/all-gather:
                       max(Σ_inner 2 (r_i-1)/r_i · S/m_(i-1) / B_i, max_sharp S/(m_(i-1) B_i))
                       + Σ_inner 2 (α_i + 0.4 µs (r_i - 1)) + 31 µs (tuning.cc's CollNet Direct)

Algorithm selection (NCCL's: the cheapest predicted time, ``ncclTopoGetAlgoTime``) over every
algorithm the kind has and the placement allows: ring and tree for all-reduce, hierarchical
when the group crosses more than one tier (not on NCCL's packs, :data:`NCCL_VENDORS`: NCCL has
no such algorithm), the in-network ones where the tiers offer them; ``algorithm=`` forces one
(an unavailable one is an error naming what the pack lacks).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from zrt_core.cost.backend import NodeCost, PriceSource
from zrt_core.cost.errors import CostError

if TYPE_CHECKING:
    from zrt_core.hardware import HardwareSpec, InterconnectTier

BACKEND = "roofline"
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast")
ALGORITHMS = ("ring", "tree", "hierarchical", "nvls", "nvls_tree", "collnet", "pairwise",
              "p2p", "dedup")
#: NCCL's tree bandwidth derating (tuning.cc: ``busBw * .9`` for the tree algorithm).
TREE_BANDWIDTH_FACTOR = 0.9
#: NCCL's tuning model (src/graph/tuning.cc, ``hwLatencies``, Simple protocol), µs: an NVLS
#: operation's start-up on NVLink (``[NVLINK][NVLS]``), what crossing the network adds to it
#: (``[NET][NVLS]``, NVLS across nodes runs on CollNet/SHARP), CollNet Direct's network
#: latency (``[NET][COLLNET_DIRECT]``) and its 0.4 µs per local rank of arity serialisation.
NVLS_SWITCH_US = 25.0
NVLS_NETWORK_US = 18.0
COLLNET_NETWORK_US = 31.0
COLLNET_ARITY_US = 0.4
#: The algorithms that need the pack's tiers to reduce in the network.
IN_NETWORK = ("nvls", "nvls_tree", "collnet")

_ALGORITHMS_FOR = {
    "all_reduce": ("ring", "tree", "hierarchical", "nvls", "nvls_tree", "collnet"),
    "all_gather": ("ring", "hierarchical", "nvls"),
    "reduce_scatter": ("ring", "hierarchical", "nvls"),
    "broadcast": ("ring",),
    "all_to_all": ("pairwise",),
    "send_recv": ("p2p",),
}
#: Hardware vendors whose collectives run on NCCL: its tuner (``src/graph/tuning.cc``) has
#: ring, tree, NVLS, NVLS-Tree, CollNet and PAT, and no hierarchical algorithm, so on their
#: packs ``hierarchical`` is priced only when a node names it.
NCCL_VENDORS = ("nvidia",)
#: Algorithms a node may name but the tuner never picks: a *flat* (pairwise) all-gather or
#: reduce-scatter, each rank exchanging its shard with every member directly — priced as
#: the all-to-all (its bytes cross a tier per member first reached there), without a ring's
#: sharing of one domain's inbound traffic over its rails (DeepSpeed ZeRO-3 as of 2021).
_EXPLICIT_ONLY = {"all_gather": ("pairwise",), "reduce_scatter": ("pairwise",),
                  "all_to_all": ("dedup",)}


class _Placement:
    """Which tiers a group crosses and how many of its members each tier's domain holds."""

    __slots__ = ("crossed", "members", "tiers", "top")

    def __init__(self, group_size: int, span: int, hardware: HardwareSpec) -> None:
        n = group_size
        stride = span / n
        members: list[int] = []
        tiers = hardware.interconnect
        top = len(tiers) - 1
        for i, tier in enumerate(tiers):
            if tier.devices is None or tier.devices >= span:
                members.append(n)
                top = i
                break
            members.append(min(n, max(1, int(tier.devices // stride))))
        self.tiers: tuple[InterconnectTier, ...] = tiers[: top + 1]
        self.members = members  # m_i for i = 0..top; members[top] == n
        self.top = top
        previous = 1
        crossed = []
        for i, m in enumerate(members):
            if m > previous:
                crossed.append(i)
            previous = m
        self.crossed = crossed  # tiers the group's traffic uses, innermost first

    def below(self, i: int) -> int:
        """m_(i-1): the members one domain of the tier inside tier ``i`` holds."""
        return self.members[i - 1] if i > 0 else 1

    def bandwidth(self, i: int) -> float:
        """Achievable bus bandwidth of tier ``i`` per device, bytes/s."""
        tier = self.tiers[i]
        return tier.bandwidth_gb_per_s * 1e9 * tier.efficiency

    def all_to_all_bandwidth(self, i: int) -> float:
        """Bytes/s NCCL's all-to-all moves across tier ``i`` per device: the tier's
        ``all_to_all_efficiency`` where it has one, else its bus bandwidth. The
        deduplicating dispatchers (DeepEP, HybridEP) keep the bus bandwidth
        (docs/collectives.md, "All-to-all across the network")."""
        tier = self.tiers[i]
        if tier.all_to_all_efficiency is None:
            return self.bandwidth(i)
        return tier.bandwidth_gb_per_s * 1e9 * tier.all_to_all_efficiency

    def ring_bandwidth(self) -> float:
        return min(self.below(i) * self.bandwidth(i) for i in self.crossed)

    def ratio(self, i: int) -> int:
        """r_i = m_i / m_(i-1): the tier-(i-1) domains (or members) tier ``i`` joins."""
        return self.members[i] // self.below(i)

    def nvls_bandwidth(self) -> float | None:
        """Bytes/s an NVLS reduction moves per device on the first crossed tier, or None
        when that tier's switches do not reduce."""
        tier = self.tiers[self.crossed[0]]
        if tier.nvls_efficiency is None:
            return None
        return tier.bandwidth_gb_per_s * 1e9 * tier.nvls_efficiency

    def sharp_from(self) -> int | None:
        """Position in ``crossed`` from which every crossed tier has SHARP (None: the
        outermost crossed tier has none)."""
        k = None
        for pos in range(len(self.crossed) - 1, -1, -1):
            if not self.tiers[self.crossed[pos]].sharp:
                break
            k = pos
        return k

    def unavailable(self, kind: str, algorithm: str) -> str | None:
        """Why ``algorithm`` cannot run here (None: it can)."""
        outer = self.crossed[1:]
        first = self.tiers[self.crossed[0]].name
        if algorithm == "hierarchical" and not outer:
            return "the group crosses one tier only"
        if algorithm in ("nvls", "nvls_tree") and self.nvls_bandwidth() is None:
            return f"tier {first} has no nvls_efficiency (no NVLink SHARP)"
        if algorithm == "nvls" and outer and (kind != "all_reduce" or not all(
                self.tiers[i].sharp for i in outer)):
            return ("NVLS across tiers needs SHARP (sharp: true) on every outer tier"
                    if kind == "all_reduce" else
                    "an NVLS all-gather/reduce-scatter stays inside one NVSwitch domain")
        if algorithm == "nvls_tree" and not outer:
            return "NVLS-Tree joins several NVSwitch domains; the group sits in one"
        if algorithm == "collnet" and self.sharp_from() is None:
            return f"tier {self.tiers[self.crossed[-1]].name} has no sharp: true (no SHARP)"
        return None

    def describe(self) -> list[dict[str, object]]:
        return [{"tier": self.tiers[i].name, "members": self.members[i],
                 "bus_gb_per_s": round(self.bandwidth(i) / 1e9, 3)} for i in self.crossed]


def collective_cost(kind: str, bytes: float, group_size: int, span: int,
                    hardware: HardwareSpec, algorithm: str | None = None,
                    routing: tuple[int, int] | None = None) -> NodeCost:
    """Price one collective per rank on ``hardware``'s interconnect.

    :param kind: one of :data:`KINDS`.
    :param bytes: the message bytes per rank (docs/architecture.md, collective nodes).
    :param group_size: members of the group.
    :param span: consecutive ranks the members spread over (``Parallel.span``).
    :param algorithm: ``ring``, ``tree``, ``hierarchical``, ``nvls``, ``nvls_tree``,
        ``collnet`` (``pairwise`` for all-to-all, ``p2p`` for send/recv); None picks the
        cheapest the hardware's tiers allow, as NCCL's tuner does. ``dedup``
        (all-to-all only, never picked by the tuner) is an MoE dispatch or combine that
        sends a token once per destination GPU inside a node and once per destination node
        across nodes (DeepEP, HybridEP); it needs ``routing``.
    :param routing: ``(routed experts, experts per token)`` of a ``dedup`` all-to-all:
        ``bytes`` holds one row per (token, expert) pair.
    :raises CostError: an unknown kind or algorithm, or a group that does not fit its span.
    """
    if kind not in _ALGORITHMS_FOR:
        raise CostError(f"unknown collective {kind!r}", f"use one of {', '.join(KINDS)}")
    if group_size < 1 or span < group_size:
        raise CostError(
            f"{kind}: group of {group_size} cannot spread over {span} ranks",
            "span is at least the group size (see Parallel.span)")
    if bytes < 0:
        raise CostError(f"{kind}: negative message size {bytes}")
    allowed = _ALGORITHMS_FOR[kind]
    if algorithm is not None and algorithm not in allowed + _EXPLICIT_ONLY.get(kind, ()):
        raise CostError(f"{kind} has no {algorithm!r} algorithm",
                        f"use one of {', '.join(allowed)} or leave it unset")
    if group_size == 1 or bytes == 0:
        return NodeCost(time_s=0.0, backend=BACKEND, rule=f"{kind}_trivial",
                        source=PriceSource.FREE, bound="free",
                        detail={"group_size": group_size, "bytes": bytes})

    if algorithm == "dedup" and (routing is None or routing[0] < 1 or not
                                 0 < routing[1] <= routing[0]):
        raise CostError(f"a dedup all-to-all needs (experts, experts per token), got {routing}",
                        "the EP transform sets attrs['routing'] on MoE dispatch/combine nodes")
    place = _Placement(group_size, span, hardware)
    if algorithm == "dedup":
        priced = {"dedup": _price_dedup(float(bytes), group_size, place,
                                        routing)}  # type: ignore[arg-type]
    else:
        if algorithm in IN_NETWORK:
            why = place.unavailable(kind, algorithm)
            if why is not None:
                raise CostError(f"{kind} over {group_size} ranks on {hardware.id} cannot use "
                                f"{algorithm!r}: {why}",
                                "leave the algorithm unset, or use a pack whose tiers offer "
                                "it (docs/collectives.md)")
        tuned = [a for a in allowed
                 if not (a == "hierarchical" and hardware.vendor in NCCL_VENDORS)]
        candidates = [algorithm] if algorithm else [
            a for a in tuned if place.unavailable(kind, a) is None]
        priced = {a: _price(kind, a, float(bytes), group_size, place) for a in candidates}
    chosen = min(priced, key=lambda a: sum(priced[a]))
    wire_s, latency_s = priced[chosen]
    detail: dict[str, object] = {
        "algorithm": chosen,
        "group_size": group_size,
        "span": span,
        "bytes": bytes,
        "tier": place.tiers[place.top].name,
        "tiers": place.describe(),
    }
    if len(priced) > 1:
        detail["candidates_s"] = {a: sum(t) for a, t in priced.items()}
    return NodeCost(
        time_s=wire_s + latency_s, backend=BACKEND, rule=f"{chosen}_{kind}",
        source=PriceSource.ROOFLINE, compute_s=0.0, memory_s=wire_s, overhead_s=latency_s,
        bound="network" if wire_s >= latency_s else "latency", detail=detail,
    )


def _domain_hit(experts: int, top_k: int, domains: float) -> float:
    """Probability that one of ``domains`` equal domains (GPUs or nodes) holds at least one
    of a token's ``top_k`` experts, the experts drawn uniformly without replacement from
    ``experts`` (balanced routing: Megatron-Bridge forces it in its benchmarks)."""
    per = experts / domains
    miss = 1.0
    for j in range(top_k):
        miss *= max(0.0, (experts - per - j) / (experts - j))
    return 1.0 - miss


def _price_dedup(size: float, n: int, place: _Placement, routing: tuple[int, int]
                 ) -> tuple[float, float]:
    """A deduplicating MoE all-to-all (DeepEP ``deep_ep/buffer.py`` normal kernels;
    Megatron-Core's flex dispatcher with HybridEP): a token goes once to each destination
    *node* over the scale-out tier, then over NVLink to each destination GPU there, where
    Megatron's alltoall dispatcher sends one row per (token, expert) pair.

    One copy of the tokens is ``size / top_k``. Crossing tier ``i > 0`` it travels to each
    *other* domain of ``below(i)`` ranks holding one of its experts: ``(D − 1) · P(D)``
    copies, ``D = n / below(i)``. Over the innermost tier every copy to a GPU other than
    the one it lands on crosses NVLink once (sent directly inside a node, forwarded after
    the scale-out hop): ``(n − n / m_0) · P(n)`` copies. With ``top_k = 1`` both give the
    pairwise all-to-all's shares."""
    experts, top_k = routing
    row = size / top_k
    wire = 0.0
    for i in place.crossed:
        if i == 0:
            copies = (n - n / place.members[0]) * _domain_hit(experts, top_k, n)
        else:
            domains = n / place.below(i)
            copies = (domains - 1) * _domain_hit(experts, top_k, domains)
        wire = max(wire, row * copies / place.bandwidth(i))
    return wire, _alpha(place, place.crossed[-1])


def _alpha(place: _Placement, i: int) -> float:
    return place.tiers[i].latency_us * 1e-6


def _price(kind: str, algorithm: str, size: float, n: int, place: _Placement
           ) -> tuple[float, float]:
    """(bandwidth seconds, latency seconds) of one algorithm."""
    if algorithm == "ring":
        bw = place.ring_bandwidth()
        if kind == "broadcast":
            return size / bw, (n - 1) * _alpha(place, place.crossed[-1])
        factor = 2.0 if kind == "all_reduce" else 1.0
        latency = 0.0
        for i in place.crossed:
            # d_(i-1) - d_i ring steps of this tier, d_i = n / m_i domains of tier i
            steps = n // place.below(i) - n // place.members[i]
            latency += factor * steps * _alpha(place, i)
        return factor * (n - 1) / n * size / bw, latency
    if algorithm == "tree":
        bw = TREE_BANDWIDTH_FACTOR * place.ring_bandwidth()
        latency = 0.0
        for i in place.crossed:
            r = place.members[i] // place.below(i)
            hops = (r - 1) if i == place.crossed[0] and i == 0 else math.ceil(math.log2(r))
            latency += 2 * hops * _alpha(place, i)
        return 2 * size / bw, latency
    if algorithm in IN_NETWORK:
        return _price_in_network(kind, algorithm, size, n, place)
    if algorithm == "hierarchical":
        factor = 2.0 if kind == "all_reduce" else 1.0
        wire = latency = 0.0
        for i in place.crossed:
            r = place.members[i] // place.below(i)
            shard = size / place.below(i)
            wire += factor * (r - 1) / r * shard / place.bandwidth(i)
            latency += factor * (r - 1) * _alpha(place, i)
        return wire, latency
    if algorithm == "pairwise":
        wire = 0.0
        for i in place.crossed:
            share = (place.members[i] - place.below(i)) / n * size
            # a flat all-gather / reduce-scatter (ZeRO-3 of 2021) keeps the tier's rate
            bw = place.all_to_all_bandwidth(i) if kind == "all_to_all" else \
                place.bandwidth(i)
            wire = max(wire, share / bw)
        return wire, _alpha(place, place.crossed[-1])
    # p2p: one message to the neighbouring stage over the outermost tier the group crosses
    top = place.crossed[-1]
    return size / place.bandwidth(top), _alpha(place, top)


def _price_in_network(kind: str, algorithm: str, size: float, n: int, place: _Placement
                      ) -> tuple[float, float]:
    """(bandwidth seconds, latency seconds) of nvls, nvls_tree or collnet (module docstring).

    The stages (inside the NVSwitch domain, across the network) stream through each other
    as NCCL's channels do, so the slower stage sets the bandwidth time (tuning.cc takes the
    minimum of the intra- and inter-node bandwidths for NVLS and NVLS-Tree)."""
    outer = place.crossed[1:]
    if algorithm == "collnet":
        k = place.sharp_from()
        assert k is not None
        inner, net = place.crossed[:k], place.crossed[k:]
        intra = latency = 0.0
        for i in inner:
            r = place.ratio(i)
            intra += 2 * (r - 1) / r * size / place.below(i) / place.bandwidth(i)
            latency += 2 * (_alpha(place, i) + COLLNET_ARITY_US * 1e-6 * (r - 1))
        inter = max(size / place.below(i) / place.bandwidth(i) for i in net)
        return max(intra, inter), latency + COLLNET_NETWORK_US * 1e-6
    nvls_bw = place.nvls_bandwidth()
    assert nvls_bw is not None
    if kind != "all_reduce":
        # multicast store (all-gather) or multimem reduce (reduce-scatter) of the other
        # members' (n-1)/n of the buffer, inside one NVSwitch domain
        return (n - 1) / n * size / nvls_bw, NVLS_SWITCH_US * 1e-6
    # each device sends its S into the switch and receives the reduced S back
    wire = size / nvls_bw
    latency = NVLS_SWITCH_US * 1e-6
    if algorithm == "nvls":  # SHARP over the outer tiers: S / m_(i-1) up and down per NIC
        for i in outer:
            wire = max(wire, size / place.below(i) / place.bandwidth(i))
        if outer:
            latency += NVLS_NETWORK_US * 1e-6
        return wire, latency
    for i in outer:  # nvls_tree: double binary trees between the domains' NICs
        r = place.ratio(i)
        f = 1.0 if r == 2 else 2.0
        wire = max(wire, f * size / (TREE_BANDWIDTH_FACTOR * place.below(i)
                                     * place.bandwidth(i)))
        latency += 2 * math.ceil(math.log2(r)) * _alpha(place, i)
    return wire, latency
