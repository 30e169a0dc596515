"""Layout of virtual stages on ranks, and the P2P time of each stage boundary on the interconnect."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from zrt_core.hardware import HardwareSpec, InterconnectTier
    from zrt_core.strategy import Parallel


# -- layout of virtual stages on ranks --------------------------------------------------------


def stage_rank(schedule: str, pp: int, vp: int, stage: int) -> int:
    """The pipeline rank that runs virtual stage ``stage``."""
    if schedule == "interleaved":
        return stage % pp
    if schedule in ("zb-v", "dualpipev"):
        return stage if stage < pp else 2 * pp - 1 - stage
    return stage


def boundary_tiers(hardware: HardwareSpec, parallel: Parallel) -> tuple[InterconnectTier, ...]:
    """The interconnect tier each pipeline boundary crosses, rank ``i`` to ``i + 1`` for
    ``i < pp - 1``, then the wrap-around ``pp - 1`` to 0 (used by interleaved 1F1B).

    Pipeline ranks are ``tp × cp × dp`` global ranks apart (Megatron order, PP outermost).
    All members of a stage send at once, so a boundary takes the outermost tier any of its
    rank pairs needs: a pair shares a tier's domain when both ranks fall in the same
    aligned block of ``tier.devices`` ranks.
    """
    stride = parallel.tp * parallel.cp * parallel.dp
    pp = parallel.pp

    def tier_of(a_stage: int, b_stage: int) -> InterconnectTier:
        worst = 0
        for x in range(stride):
            a, b = a_stage * stride + x, b_stage * stride + x
            for level, tier in enumerate(hardware.interconnect):
                if tier.devices is None or a // tier.devices == b // tier.devices:
                    worst = max(worst, level)
                    break
        return hardware.interconnect[worst]

    tiers = [tier_of(i, i + 1) for i in range(pp - 1)]
    tiers.append(tier_of(pp - 1, 0))
    return tuple(tiers)


def p2p_times_s(
    hardware: HardwareSpec,
    parallel: Parallel,
    message_bytes: float,
    price: Callable[[InterconnectTier, float], float] | None = None,
) -> tuple[tuple[float, ...], float]:
    """P2P time of each boundary and of the wrap-around, for ``simulate(p2p_s=...,
    p2p_wrap_s=...)``.

    :param message_bytes: the activation (= activation-gradient) one rank sends per
        micro-batch.
    :param price: ``(tier, bytes) -> seconds``; the default is the α-β model of the tier:
        ``latency + bytes / (bandwidth × efficiency)``.
    """
    if price is None:
        def price(tier: InterconnectTier, nbytes: float) -> float:
            return tier.latency_us * 1e-6 + nbytes / (
                tier.bandwidth_gb_per_s * 1e9 * tier.efficiency)
    tiers = boundary_tiers(hardware, parallel)
    times = tuple(price(t, message_bytes) for t in tiers)
    return times[:-1], times[-1]
