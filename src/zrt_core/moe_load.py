"""MoE routing load across expert-parallel ranks: the busiest rank's share of the routed rows
under a routing skew, per-step sampling, and DeepSeek's EPLB redundant experts (docs/moe-training.md).

An EP step waits for its busiest rank: the grouped GEMMs and the all-to-all it receives scale
with that rank's rows. :meth:`ExpertLoad.rank_load` is the factor over the balanced rows
(``tokens·top_k/ep``) that the parallel pass applies to the routed rows of one rank.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from attrs import field, frozen

from zrt_core.errors import LayoutError, SpecError

#: Named per-step routing distributions (``--moe-imbalance dist:NAME``).
#: ``multinomial``: every (token, expert) assignment drawn independently with the experts'
#: mean shares — the spread SGLang simulates as "perfect EPLB" (random expert selection,
#: LMSYS 2025-05-05 large-scale EP post); what no placement can remove at a finite batch.
#: Besides it, every measured skew in ``data/routing`` (:func:`routing_skews`).
DISTRIBUTIONS = ("multinomial",)


@frozen
class RoutingSkew:
    """A published, measured routing skew (``data/routing/NAME.yaml``): tokens routed to
    each of some experts of one MoE layer of a served model, read as a sample of that
    model's expert popularities.

    :param counts: routed tokens per expert, as measured.
    :param model, source, dataset, measured: where the numbers come from.
    """

    name: str
    counts: tuple[float, ...]
    model: str = ""
    source: str = ""
    dataset: str = ""
    measured: str = ""

    @property
    def cv(self) -> float:
        """The counts' coefficient of variation (population standard deviation over mean)."""
        mean = sum(self.counts) / len(self.counts)
        var = sum((c - mean) ** 2 for c in self.counts) / len(self.counts)
        return math.sqrt(var) / mean

    def profile(self, experts: int) -> tuple[float, ...]:
        """Expected popularity shares of ``experts`` experts, most popular first: expert
        ``i`` takes the sample's quantile at ``(i + 1/2)/experts`` (the sorted counts as a
        step function), normalised to sum to 1."""
        ranked = sorted(self.counts, reverse=True)
        n = len(ranked)
        raw = [ranked[min(n - 1, int((i + 0.5) * n / experts))] for i in range(experts)]
        total = sum(raw)
        return tuple(r / total for r in raw)


@functools.cache
def routing_skews() -> Mapping[str, RoutingSkew]:
    """The measured skews bundled in ``zrt_core/data/routing``, by name (read once)."""
    from importlib import resources

    import yaml

    out: dict[str, RoutingSkew] = {}
    folder = resources.files("zrt_core") / "data" / "routing"
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".yaml"):
            continue
        data = yaml.safe_load(entry.read_text(encoding="utf-8"))
        counts = data.get("counts") if isinstance(data, dict) else None
        if not counts or any(isinstance(c, bool) or not isinstance(c, (int, float))
                             or c < 0 for c in counts) or not sum(counts):
            raise SpecError(f"data/routing/{entry.name}: counts must be a list of routed "
                            "token counts >= 0, not all 0")
        out[str(data["name"])] = RoutingSkew(
            name=str(data["name"]), counts=tuple(float(c) for c in counts),
            **{k: str(data.get(k, "")).strip() for k in ("model", "source", "dataset",
                                                          "measured")})
    return MappingProxyType(out)


def distribution_names() -> tuple[str, ...]:
    """Every name ``--moe-imbalance dist:NAME`` accepts."""
    return DISTRIBUTIONS + tuple(routing_skews())


def _imbalance(_inst: Any, _attr: Any, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 1.0:
        raise SpecError(f"moe imbalance must be a number >= 1.0, got {value!r}",
                        "1.0 is balanced routing; 2.0 gives the busiest expert twice the mean")


def _distribution(_inst: Any, _attr: Any, value: Any) -> None:
    if value is not None and value not in DISTRIBUTIONS and value not in routing_skews():
        names = distribution_names()
        raise SpecError(f"unknown MoE routing distribution {value!r}",
                        f"use dist:{' or dist:'.join(names)}")


def _redundant(_inst: Any, _attr: Any, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SpecError(f"--eplb must be a count of redundant experts >= 0, got {value!r}")


@frozen
class ExpertLoad:
    """How routed tokens load the experts of one MoE layer.

    :param imbalance: the busiest expert's mean load over the mean expert's (a persistent
        skew, shaped as the capture's ``routing_histogram``: expert 0 hot, the rest even).
    :param distribution: None (the mean loads every step), a name in :data:`DISTRIBUTIONS`
        (per-step counts drawn around the mean loads; the expected busiest rank) or a
        measured skew of :func:`routing_skews` (expert popularities drawn from it, then
        per-step counts; :meth:`rank_load`).
    :param redundant: EPLB redundant experts (DeepSeek-V3's deployment: 32 for prefill on
        EP32), replicated and packed as ``deepseek-ai/EPLB``'s global policy places them.
    """

    imbalance: float = field(default=1.0, validator=_imbalance, converter=float)
    distribution: str | None = field(default=None, validator=_distribution)
    redundant: int = field(default=0, validator=_redundant)

    def __attrs_post_init__(self) -> None:
        if self.imbalance != 1.0 and self.skew is not None:
            raise SpecError(f"a measured routing skew (dist:{self.distribution}) sets the "
                            "experts' loads itself; it takes no imbalance",
                            "give --moe-imbalance X or dist:NAME, not both")

    @property
    def skew(self) -> RoutingSkew | None:
        """The measured skew :attr:`distribution` names, or None."""
        if self.distribution is None or self.distribution in DISTRIBUTIONS:
            return None
        return routing_skews()[self.distribution]

    @classmethod
    def parse(cls, text: str, redundant: int = 0) -> ExpertLoad:
        """``"1.3"`` (a constant skew) or ``"dist:NAME"`` (:func:`distribution_names`)."""
        text = str(text).strip()
        if text.startswith("dist:"):
            return cls(distribution=text[5:], redundant=redundant)
        try:
            value = float(text)
        except ValueError:
            raise SpecError(f"--moe-imbalance must be a number >= 1.0 or dist:NAME, got "
                            f"{text!r}", f"e.g. 1.5 or dist:{DISTRIBUTIONS[0]}") from None
        return cls(imbalance=value, redundant=redundant)

    @property
    def is_default(self) -> bool:
        return self.imbalance == 1.0 and self.distribution is None and self.redundant == 0

    def to_json(self) -> dict[str, Any]:
        return {"imbalance": self.imbalance, "distribution": self.distribution,
                "redundant": self.redundant}

    def describe(self) -> str:
        parts = []
        if self.imbalance != 1.0:
            parts.append(f"busiest expert {self.imbalance:g}x the mean")
        if self.skew is not None:
            parts.append(f"routing skew {self.distribution} (measured, CV "
                         f"{self.skew.cv:.2f}) sampled per step")
        elif self.distribution:
            parts.append(f"{self.distribution} routing per step")
        if self.redundant:
            parts.append(f"EPLB with {self.redundant} redundant experts")
        return ", ".join(parts) or "balanced routing"

    def check(self, experts: int, ep: int) -> None:
        """Refuse an EPLB that the layout cannot place (one line, exit 2)."""
        if not self.redundant:
            return
        if experts <= 1:
            raise LayoutError("--eplb needs a MoE model (routed experts); this one has none",
                              "drop --eplb")
        if ep <= 1:
            raise LayoutError("--eplb places redundant experts over expert-parallel ranks; "
                              "--ep is 1", "set --ep > 1 or drop --eplb")
        if self.redundant > experts:
            raise LayoutError(f"--eplb {self.redundant} is more redundant experts than the "
                              f"model's {experts} experts",
                              f"use at most {experts} (DeepSeek-V3 serves 256 experts with 32)")
        if (experts + self.redundant) % ep:
            raise LayoutError(f"--eplb {self.redundant}: {experts} + {self.redundant} "
                              f"physical experts do not split over --ep {ep}",
                              "EPLB needs (experts + redundant) divisible by ep")

    # -- the loads ---------------------------------------------------------------------

    def expert_shares(self, experts: int) -> tuple[float, ...]:
        """Each expert's mean share of the routed rows (sums to 1); under a measured skew its
        expected popularity profile, most popular first (:meth:`RoutingSkew.profile`)."""
        skew = self.skew
        if skew is not None:
            return skew.profile(experts)
        hot = min(1.0, self.imbalance / experts)
        if experts == 1:
            return (1.0,)
        rest = (1.0 - hot) / (experts - 1)
        return (hot, *([rest] * (experts - 1)))

    def rank_shares(self, experts: int, ep: int) -> tuple[float, ...]:
        """Each EP rank's mean share of the routed rows: contiguous blocks of ``experts/ep``
        (Megatron-Core's and SGLang's default placement), or EPLB's placement with
        :attr:`redundant` replicas (a replica takes an equal part of its expert's rows)."""
        shares = self.expert_shares(experts)
        if not self.redundant:
            per = experts // ep
            return tuple(sum(shares[r * per:(r + 1) * per]) for r in range(ep))
        phys_share = eplb_physical_shares(shares, experts + self.redundant)
        packs = balanced_packing(phys_share, ep)
        return tuple(sum(phys_share[i] for i in pack) for pack in packs)

    def rank_load(self, experts: int, ep: int, assignments: int) -> float:
        """The busiest EP rank's rows over the balanced rows (``assignments/ep``), where
        ``assignments`` (tokens × top-k over the EP group) are routed in one step.

        Without a distribution, ``ep · max_r share_r``. With ``multinomial``, rank ``r``
        receives ``X_r ~ Binomial(N, share_r)`` rows (normal approximation, ``N`` the
        assignments) and the factor is ``E[max_r X_r] / (N/ep)``.
        """
        if ep <= 1 or experts <= 1:
            return 1.0
        skew = self.skew
        if skew is not None and not self.redundant:
            return _skewed_rank_load(skew.cv, experts, ep, assignments)
        shares = self.rank_shares(experts, ep)
        if self.distribution is None or assignments <= 0:
            return ep * max(shares)
        means = [assignments * s for s in shares]
        sigmas = [math.sqrt(assignments * s * (1.0 - s)) for s in shares]
        return expected_max_normal(means, sigmas) / (assignments / ep)


def _skewed_rank_load(cv: float, experts: int, ep: int, assignments: int) -> float:
    """The busiest rank's expected rows over ``N/ep`` under a measured skew without EPLB.

    The ``E`` experts' popularities are drawn from the measured counts (coefficient of
    variation ``c``) and placed in contiguous blocks of ``m = E/ep`` experts, a placement
    that knows nothing of popularity (Megatron-Core's and SGLang's default). A rank's share
    of the popularity mass is then a sum of ``m`` of the ``E`` draws: mean ``1/ep``,
    variance ``(c²/m)·(E − m)/(E − 1)/ep²`` (sampling ``m`` of ``E`` without replacement,
    the shares summing to 1). Given the shares, a step's ``N`` rows are multinomial:
    ``N·s·(1 − s)`` more, with ``s = 1/ep``. Rank ``r`` receives
    ``X_r ≈ Normal(N/ep, (N/ep)²·(c²/m)·(E − m)/(E − 1) + N·(1/ep)·(1 − 1/ep))`` and the
    factor is ``E[max_r X_r]/(N/ep)`` (:func:`expected_max_normal`, the ranks taken as
    independent). With ``N <= 0`` (no step size) only the placement term counts."""
    per = experts / ep
    mean = assignments / ep if assignments > 0 else 1.0
    placement = mean ** 2 * cv ** 2 / per * (experts - per) / (experts - 1)
    draw = assignments * (1 / ep) * (1 - 1 / ep) if assignments > 0 else 0.0
    sigma = math.sqrt(placement + draw)
    return expected_max_normal([mean] * ep, [sigma] * ep) / mean


def eplb_physical_shares(shares: tuple[float, ...], physical: int) -> tuple[float, ...]:
    """EPLB's ``replicate_experts``: each redundant slot replicates the logical expert with
    the largest load per replica (first on ties); a physical expert carries its logical
    expert's load over that expert's replica count. Returns the physical experts' shares."""
    count = [1] * len(shares)
    owner = list(range(len(shares)))
    for _ in range(len(shares), physical):
        best = max(range(len(shares)), key=lambda i: (shares[i] / count[i], -i))
        owner.append(best)
        count[best] += 1
    return tuple(shares[o] / count[o] for o in owner)


def balanced_packing(weights: tuple[float, ...], packs: int) -> list[list[int]]:
    """EPLB's ``balanced_packing``: items in decreasing weight (stable), each into the
    lightest pack that still has room; every pack takes ``len(weights)/packs`` items."""
    per = len(weights) // packs
    load = [0.0] * packs
    items: list[list[int]] = [[] for _ in range(packs)]
    for i in sorted(range(len(weights)), key=lambda j: -weights[j]):
        pack = min((p for p in range(packs) if len(items[p]) < per), key=lambda p: load[p])
        items[pack].append(i)
        load[pack] += weights[i]
    return items


def expected_max_normal(means: list[float], sigmas: list[float], steps: int = 4000) -> float:
    """``E[max_r X_r]`` of independent ``X_r ~ N(means[r], sigmas[r]²)``, as
    ``lo + ∫_lo^hi (1 − Π_r Φ((x − μ_r)/σ_r)) dx`` (Simpson's rule; the tail beyond 12 σ
    is below 1e-30). Two equal normals give ``μ + σ/√π``."""
    if all(s == 0 for s in sigmas):
        return max(means)
    top = max(sigmas)
    lo = min(means) - 12 * top
    hi = max(means) + 12 * top
    h = (hi - lo) / steps

    def survival(x: float) -> float:
        cdf = 1.0
        for m, s in zip(means, sigmas, strict=True):
            cdf *= 0.5 * (1.0 + math.erf((x - m) / (s * math.sqrt(2.0)))) if s > 0 else \
                (1.0 if x >= m else 0.0)
        return 1.0 - cdf

    total = survival(lo) + survival(hi)
    for k in range(1, steps):
        total += (4 if k % 2 else 2) * survival(lo + k * h)
    return lo + total * h / 3
