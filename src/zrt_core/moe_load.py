"""MoE routing load across expert-parallel ranks: the busiest rank's share of the routed rows
under a routing skew, per-step sampling, and DeepSeek's EPLB redundant experts (docs/moe-training.md).

An EP step waits for its busiest rank: the grouped GEMMs and the all-to-all it receives scale
with that rank's rows. :meth:`ExpertLoad.rank_load` is the factor over the balanced rows
(``tokens·top_k/ep``) that the parallel pass applies to the routed rows of one rank.
"""

from __future__ import annotations

import math
from typing import Any

from attrs import field, frozen

from zrt_core.errors import LayoutError, SpecError

#: Named per-step routing distributions (``--moe-imbalance dist:NAME``).
#: ``multinomial``: every (token, expert) assignment drawn independently with the experts'
#: mean shares — the spread SGLang simulates as "perfect EPLB" (random expert selection,
#: LMSYS 2025-05-05 large-scale EP post); what no placement can remove at a finite batch.
DISTRIBUTIONS = ("multinomial",)


def _imbalance(_inst: Any, _attr: Any, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 1.0:
        raise SpecError(f"moe imbalance must be a number >= 1.0, got {value!r}",
                        "1.0 is balanced routing; 2.0 gives the busiest expert twice the mean")


def _distribution(_inst: Any, _attr: Any, value: Any) -> None:
    if value is not None and value not in DISTRIBUTIONS:
        raise SpecError(f"unknown MoE routing distribution {value!r}",
                        f"use dist:{' or dist:'.join(DISTRIBUTIONS)}")


def _redundant(_inst: Any, _attr: Any, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SpecError(f"--eplb must be a count of redundant experts >= 0, got {value!r}")


@frozen
class ExpertLoad:
    """How routed tokens load the experts of one MoE layer.

    :param imbalance: the busiest expert's mean load over the mean expert's (a persistent
        skew, shaped as the capture's ``routing_histogram``: expert 0 hot, the rest even).
    :param distribution: None (the mean loads every step) or a name in :data:`DISTRIBUTIONS`
        (per-step counts drawn around the mean loads; the expected busiest rank).
    :param redundant: EPLB redundant experts (DeepSeek-V3's deployment: 32 for prefill on
        EP32), replicated and packed as ``deepseek-ai/EPLB``'s global policy places them.
    """

    imbalance: float = field(default=1.0, validator=_imbalance, converter=float)
    distribution: str | None = field(default=None, validator=_distribution)
    redundant: int = field(default=0, validator=_redundant)

    @classmethod
    def parse(cls, text: str, redundant: int = 0) -> ExpertLoad:
        """``"1.3"`` (a constant skew) or ``"dist:NAME"`` (:data:`DISTRIBUTIONS`)."""
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
        if self.distribution:
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
        """Each expert's mean share of the routed rows (sums to 1)."""
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
        shares = self.rank_shares(experts, ep)
        if self.distribution is None or assignments <= 0:
            return ep * max(shares)
        means = [assignments * s for s in shares]
        sigmas = [math.sqrt(assignments * s * (1.0 - s)) for s in shares]
        return expected_max_normal(means, sigmas) / (assignments / ep)


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
