"""Pipeline schedules: an event-level simulation of one training step over pipeline ranks.

Each schedule is written down as the per-rank order of operations its paper or reference
code defines (GPipe, 1F1B, Megatron's interleaved 1F1B, ZB-H1, ZB-V, DualPipe, DualPipeV;
see ``docs/pipeline-schedules.md``). The simulation then runs those orders against the
dependencies between them: a rank executes its list in order, each operation starting when
the rank is free and its input has arrived (the producing operation's end plus the P2P
time of the boundary between the two ranks). Nothing is closed-form; the closed forms of the
papers are what the tests check the simulation against.

Times are per *virtual stage*: ``pp`` stages for GPipe/1F1B/ZB-H1/DualPipe, ``pp × vp`` for
interleaved, ``2 × pp`` for the V-shaped schedules (ZB-V, DualPipeV). Virtual stage ``v``
holds the ``v``-th contiguous group of layers in model order: the first has the embedding,
the last the head and loss, so uneven stages are just uneven times.
"""

# Every name the module had is importable from here as before: the package re-exports
# each submodule's top-level names (private ones too, for the tests and other modules).
from __future__ import annotations

from zrt_core.errors import (  # noqa: F401  (the old module's imported names)
    LayoutError,
)
from zrt_core.limits import (  # noqa: F401  (the old module's imported names)
    SCHEDULES,
    _check_name,
    check_schedule,
    virtual_stages,
)
from zrt_core.schedule.pipeline.engine import (  # noqa: F401
    _cross_rank,
    _Engine,
    _p2p,
)
from zrt_core.schedule.pipeline.fast_forward import (  # noqa: F401
    _MIN_BLOCKS,
    _STEADY,
    _fast_forward,
    _find_period,
    _p2p_waits,
    _phase_plan,
    _PhasePlan,
    _runs,
    _skip_phase,
)
from zrt_core.schedule.pipeline.orders import (  # noqa: F401
    _dualpipe_like,
    _fifo,
    _gpipe,
    _interleaved,
    _one_f_one_b,
    _orders,
    _Seq,
    _zb_h1,
    _zb_v,
    schedule_orders,
)
from zrt_core.schedule.pipeline.ranks import (  # noqa: F401
    boundary_tiers,
    p2p_times_s,
    stage_rank,
)
from zrt_core.schedule.pipeline.simulation import (  # noqa: F401
    simulate,
)
from zrt_core.schedule.pipeline.values import (  # noqa: F401
    BW,
    FBW,
    KIND_NAMES,
    SPLIT_BACKWARD,
    B,
    F,
    PipelineOp,
    PipelineResult,
    RankStats,
    StageTimes,
    W,
    _float_tuple,
    _OpTable,
    _required_floats,
)
