"""The values of a pipeline simulation: per-stage times in, per-operation and per-rank results out."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
from attrs import field, frozen

from zrt_core.errors import LayoutError

if TYPE_CHECKING:

    pass


#: Schedules that split backward into B (input gradient) and W (weight gradient).
SPLIT_BACKWARD = frozenset({"zb-h1", "zb-v", "dualpipe", "dualpipev"})

# Operation kinds. BW is a whole backward (input and weight gradients in one pass); FBW is
# DualPipe's overlapped pair, a forward of one chunk with a whole backward of another.
F, B, W, BW, FBW = 0, 1, 2, 3, 4
KIND_NAMES = ("F", "B", "W", "BW", "F+BW")


def _float_tuple(value: float | Sequence[float] | None) -> tuple[float, ...] | None:
    if value is None:
        return None
    if isinstance(value, int | float):
        return (float(value),)
    return tuple(float(v) for v in value)


def _required_floats(value: float | Sequence[float]) -> tuple[float, ...]:
    out = _float_tuple(value)
    assert out is not None
    return out


@frozen
class StageTimes:
    """Per-virtual-stage times of one micro-batch (a single number applies to every stage).

    :param forward_s: forward of one micro-batch through the stage.
    :param backward_s: its whole backward, input and weight gradients together.
    :param weight_s: the weight-gradient part of ``backward_s`` (W); the rest is B. The
        zero-bubble schedules and DualPipe need it; the others run backward whole.
    :param forward_comm_s: the part of ``forward_s`` that is communication (EP all-to-all,
        TP collectives) a concurrently running backward chunk can hide (DualPipe's overlap).
    :param backward_comm_s: the same for ``backward_s``.
    :param activation_bytes: activations one micro-batch leaves on the stage until its
        backward frees them (None: report activation only in units).
    """

    forward_s: tuple[float, ...] = field(converter=_required_floats)
    backward_s: tuple[float, ...] = field(converter=_required_floats)
    weight_s: tuple[float, ...] | None = field(default=None, converter=_float_tuple)
    forward_comm_s: tuple[float, ...] | None = field(default=None, converter=_float_tuple)
    backward_comm_s: tuple[float, ...] | None = field(default=None, converter=_float_tuple)
    activation_bytes: tuple[float, ...] | None = field(default=None, converter=_float_tuple)

    def expanded(self, stages: int) -> StageTimes:
        """Every field broadcast to ``stages`` entries; a wrong length is a LayoutError."""
        def fit(name: str, value: tuple[float, ...] | None) -> tuple[float, ...] | None:
            if value is None or len(value) == stages:
                return value
            if len(value) == 1:
                return value * stages
            raise LayoutError(
                f"{name} has {len(value)} entries but the schedule has {stages} virtual stages",
                "give one time per virtual stage (see virtual_stages()) or a single number",
            )

        out = StageTimes(
            forward_s=fit("forward_s", self.forward_s),  # type: ignore[arg-type]
            backward_s=fit("backward_s", self.backward_s),  # type: ignore[arg-type]
            weight_s=fit("weight_s", self.weight_s),
            forward_comm_s=fit("forward_comm_s", self.forward_comm_s),
            backward_comm_s=fit("backward_comm_s", self.backward_comm_s),
            activation_bytes=fit("activation_bytes", self.activation_bytes),
        )
        for name in ("forward_s", "backward_s", "weight_s", "forward_comm_s",
                     "backward_comm_s", "activation_bytes"):
            value = getattr(out, name)
            if value is not None and min(value) < 0:
                raise LayoutError(f"{name} has a negative entry {min(value)}",
                                  "stage times and sizes are non-negative")
        if out.weight_s is not None:
            for v, (b, w) in enumerate(zip(out.backward_s, out.weight_s, strict=True)):
                if w > b:
                    raise LayoutError(
                        f"virtual stage {v}: weight_s {w} exceeds backward_s {b}",
                        "backward_s is the whole backward; weight_s is the part of it "
                        "that computes weight gradients",
                    )
        for comm, whole in (("forward_comm_s", out.forward_s), ("backward_comm_s",
                                                                 out.backward_s)):
            value = getattr(out, comm)
            if value is not None and any(c > t for c, t in zip(value, whole, strict=True)):
                raise LayoutError(f"{comm} exceeds the stage time it is part of",
                                  f"{comm} is the communication inside the stage time")
        return out


@frozen
class PipelineOp:
    """One executed operation: ``kind`` is F, B, W, BW (whole backward) or F+BW (DualPipe's
    overlapped pair, whose ``microbatch``/``stage`` are the forward's and ``other_*`` the
    backward's)."""

    rank: int
    kind: str
    stage: int
    microbatch: int
    start_s: float
    end_s: float
    other_stage: int | None = None
    other_microbatch: int | None = None

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@frozen
class RankStats:
    """One pipeline rank over the step. ``busy_s + exposed_p2p_s + bubble_s == total``.

    :param busy_s: time computing its operations.
    :param exposed_p2p_s: idle time spent waiting on an activation or gradient in flight.
    :param bubble_s: the rest of the idle time (waiting for another rank to compute).
    :param warmup_s: from the step start to the start of its first backward.
    :param cooldown_s: from the end of its last forward to its last operation's end.
    :param peak_inflight: most micro-batch activations held at once (one per micro-batch
        per virtual stage on this rank).
    :param peak_activation_units: the same weighted by stage size, in units of one
        micro-batch's activations for ``layers / pp`` layers (1F1B's first rank: ``pp``).
    :param peak_activation_bytes: the same in bytes, when stage activation sizes were given.
    """

    rank: int
    busy_s: float
    exposed_p2p_s: float
    bubble_s: float
    warmup_s: float
    cooldown_s: float
    peak_inflight: int
    peak_activation_units: float
    peak_activation_bytes: float | None = None

    @property
    def steady_s(self) -> float:
        return self.busy_s + self.exposed_p2p_s + self.bubble_s - self.warmup_s - self.cooldown_s


@frozen(eq=False)
class PipelineResult:
    """The simulated step.

    ``total_s`` is the makespan. ``bubble_s``/``exposed_p2p_s``/``busy_s`` are those of the
    critical rank (the busiest one, which has the least idle time), so that
    ``total_s == busy_s + exposed_p2p_s + bubble_s``; per-rank values are in ``ranks``.
    ``bubble_fraction`` is ``bubble_s / total_s``. The operations themselves are kept as
    arrays and become :class:`PipelineOp` values only when asked for (``iter_ops``).
    ``simulated_ops`` of ``num_ops`` went through the event loop; the others are periodic
    steady-state blocks whose times follow exactly from the ones before (see
    ``docs/pipeline-schedules.md``).
    """

    schedule: str
    pp: int
    vp: int
    microbatches: int
    total_s: float
    ranks: tuple[RankStats, ...]
    critical_rank: int
    simulated_ops: int
    _table: _OpTable = field(repr=False, alias="_table")
    #: per rank, the end of its last operation
    rank_end_s: tuple[float, ...] = ()
    #: per virtual stage with a backward, the start of its last one (a B, a BW, or the
    #: backward half of a F+BW)
    last_backward_start_s: Mapping[int, float] = field(factory=dict)

    @property
    def busy_s(self) -> float:
        return self.ranks[self.critical_rank].busy_s

    @property
    def exposed_p2p_s(self) -> float:
        return self.ranks[self.critical_rank].exposed_p2p_s

    @property
    def bubble_s(self) -> float:
        return self.ranks[self.critical_rank].bubble_s

    @property
    def bubble_fraction(self) -> float:
        return self.bubble_s / self.total_s if self.total_s else 0.0

    @property
    def num_ops(self) -> int:
        return len(self._table.kind)

    def iter_ops(self) -> Iterator[PipelineOp]:
        """Every executed operation, rank by rank in execution order."""
        t = self._table
        columns = (t.rank.tolist(), t.kind.tolist(), t.stage.tolist(), t.microbatch.tolist(),
                   t.start.tolist(), t.duration.tolist(), t.stage2.tolist(),
                   t.microbatch2.tolist())
        for rank, kind, v, mb, start, dur, v2, mb2 in zip(*columns, strict=True):
            yield PipelineOp(
                rank=rank, kind=KIND_NAMES[kind], stage=v, microbatch=mb, start_s=start,
                end_s=start + dur, other_stage=v2 if v2 >= 0 else None,
                other_microbatch=mb2 if v2 >= 0 else None)

    @property
    def ops(self) -> tuple[PipelineOp, ...]:
        return tuple(self.iter_ops())


@frozen(eq=False)
class _OpTable:
    """Executed operations as parallel arrays (one row per operation, rank-major)."""

    rank: np.ndarray
    kind: np.ndarray
    stage: np.ndarray
    microbatch: np.ndarray
    stage2: np.ndarray
    microbatch2: np.ndarray
    start: np.ndarray
    duration: np.ndarray
