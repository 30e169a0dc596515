"""The two-tier training search: the screen's selection rule on hand-made numbers, the
screen keeping the exact search's best, top-k and front on a tiny model, ``--exact``
estimating every layout, and the flags that do not go together."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zrt_core.cli.main import main
from zrt_core.search.screen import Margins, ScreenResult, _undecided
from zrt_core.search.screen_model import Screened

TINY = {"model_type": "gpt2", "n_embd": 64, "n_layer": 4, "n_head": 4, "n_inner": 256,
        "vocab_size": 128, "n_positions": 256}
#: tp 1/2 × pp 1/2/4 × vp 1/2 × recompute none/full × zero1/fsdp × 1f1b/interleaved on
#: 16 GPUs; the rules keep the layouts whose vp matches the schedule
TRAIN = ["--train", "--gpus", "16", "--tp", "1,2", "--pp", "1,2,4", "--cp", "1", "--vp",
         "1,2", "--micro-batch", "1", "--recompute", "none,full", "--sharding",
         "zero1,fsdp", "--pp-schedule", "1f1b,interleaved", "--global-batch", "64",
         "--seq-len", "64"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny_gpt2_screen")
    (d / "config.json").write_text(json.dumps(TINY))
    return d


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZRT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "zrt-cache"))


class _C:
    def __init__(self, gpus: int) -> None:
        self.gpus = gpus


def _s(tput: float, mem: float) -> Screened:
    return Screened(step_s=1.0, tokens_per_s_per_gpu=tput, memory_bytes=mem,
                    usable_bytes=100.0, opt_elements=0.0)


def test_undecided_keeps_what_the_bounds_leave_a_chance() -> None:
    cands = [_C(8)] * 5
    screened = {0: _s(1000, 50), 1: _s(950, 50), 2: _s(800, 50), 3: _s(900, 40),
                4: _s(2000, 120)}
    mg = Margins(0.9, 1.1, 0.9, 1.1)
    # top-1: the bar is the best lower bound of a layout sure to fit, 1000 × 0.9 = 900
    # (layout 0: 50 × 1.1 = 55 ≤ 100). Upper bounds: layout 1 950 × 1.1 = 1045 ≥ 900 and
    # layout 3 990 ≥ 900 stay; layout 2's 880 < 900 fails the bar; layout 4 cannot fit
    # (120 × 0.9 = 108 > 100). On the front layout 2 stays: the only layouts surely faster
    # than its 880 are 0 (lower 900) and 3 (lower 810: no), and layout 0's upper memory 55
    # is not below layout 2's lower 45, so nothing surely dominates it
    assert _undecided(cands, {}, screened, mg, top_k=1) == [0, 1, 2, 3]
    # with layout 2 needing more memory (70: lower bound 63 > 55) layout 0 dominates it
    screened[2] = _s(800, 70)
    assert _undecided(cands, {}, screened, mg, top_k=1) == [0, 1, 3]
    # once layout 0 is estimated exactly at 1000 tokens/s and 50 bytes, the bar is 1000:
    # layout 1 (1045) and layout 3 (990 < 1000, but 40 × 0.9 = 36 < 50: on the front) stay
    exact = {0: {"tokens_per_s_per_gpu": 1000.0, "memory_gib": 50 / 2 ** 30, "fits": True}}
    assert _undecided(cands, exact, screened, mg, top_k=1) == [1, 3]


def test_memory_limit_counts_the_layouts_never_estimated_exactly() -> None:
    # usable 100 bytes: layouts 1 (120) and 3 (101) are over; layout 1 was estimated exactly
    # (its row says whether it fits), so only layout 3 counts as removed by screened memory
    screened = {0: _s(900, 50), 1: _s(950, 120), 2: _s(800, 99), 3: _s(700, 101)}
    res = ScreenResult(rows=[(1, {"fits": False})], screened=screened,
                       margins=Margins(1.0, 1.0, 1.0, 1.0), rounds=1)
    assert res.summary(4)["memory_screened"] == 1


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.needs("zrt-nvidia")
def test_screen_keeps_the_exact_best_top_k_and_front(
        model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ("search", str(model_dir), "--hw", "h100", *TRAIN, "--top-k", "5", "--json")
    two = _json(capsys, *args)
    exact = _json(capsys, *args, "--exact")
    assert exact["screened"] == 0 and exact["estimated_exactly"] == exact["evaluated"]
    valid = exact["enumerated"] - sum(v for k, v in exact["rejected"].items()
                                      if k != "memory" and not k.startswith("estimator"))
    assert exact["evaluated"] == valid
    assert two["screened"] > 0 and two["estimated_exactly"] < exact["estimated_exactly"]
    for key in ("results", "pareto", "winner"):
        assert two[key] == exact[key], key


@pytest.mark.needs("zrt-nvidia")
def test_screen_keeps_the_exact_answer_on_uneven_splits_and_mtp(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 6 layers: 8 entries with the embedding and the loss counted split over pp 4 (1, 2,
    # 2, 1 layers) and pp 8, which the even rule refused. The two tiers and --exact agree,
    # the uneven layouts searched; the same with one MTP depth (on the last stage).
    d = tmp_path / "six"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**TINY, "n_layer": 6}))
    args = ("search", str(d), "--hw", "h100", "--train", "--gpus", "16", "--tp", "1,2",
            "--pp", "1,2,4,8", "--cp", "1", "--vp", "1", "--micro-batch", "1",
            "--recompute", "none,full", "--sharding", "zero1", "--pp-schedule", "1f1b",
            "--global-batch", "64", "--seq-len", "64", "--top-k", "5", "--json")
    two = _json(capsys, *args)
    exact = _json(capsys, *args, "--exact")
    assert two["rejected"].get("pp_layers", 0) == 0
    assert {r["pp"] for r in exact["results"]} | {r["pp"] for r in exact["pareto"]} >= {4}
    for key in ("results", "pareto", "winner"):
        assert two[key] == exact[key], key
    mtp = _json(capsys, *args, "--mtp", "1")
    mtp_exact = _json(capsys, *args, "--mtp", "1", "--exact")
    for key in ("results", "pareto", "winner"):
        assert mtp[key] == mtp_exact[key], key
    # the MTP module's work makes every layout's step longer
    assert mtp["winner"]["tokens_per_s_per_gpu"] < two["winner"]["tokens_per_s_per_gpu"]


@pytest.mark.needs("zrt-nvidia")
@pytest.mark.parametrize("extra", [
    ("--infer", "--gpus", "2", "--input-len", "32", "--output-len", "8", "--exact"),
    ("--train", "--gpus", "4", "--global-batch", "8", "--seq-len", "64", "--strategies",
     "--exact"),
])
def test_exact_with_what_it_does_not_apply_to(model_dir: Path, extra: tuple[str, ...],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", str(model_dir), "--hw", "h100", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("zrt: error: ") and err.count("\n") == 1 and "--exact" in err


class _Inventory:
    """One parameter element per layer, no experts, no per-layer sizes."""

    def __init__(self) -> None:
        self.layers: dict = {}

    def stage_of(self, layers, rep_of, *, first, last, pp):
        return len(list(layers)), 0


def test_a_ranks_transient_and_gradient_sync_window() -> None:
    from zrt_core.search.screen_model import GroupModel, _geometry

    # 8 layers of one template (representative 0): backward 2 s each, the embedding's part
    # 1 s, the head's 4 s; transients 10 bytes (a layer, the embedding side) and 50 (head)
    g = GroupModel(fwd_s={0: 1.0, "embedding": 0.5, "head": 2.0},
                   bwd_s={0: 2.0, "embedding": 1.0, "head": 4.0},
                   act_bytes={0: 1.0}, transient_bytes={0: 10.0, "embedding": 10.0,
                                                        "head": 50.0},
                   p2p_s=0.0, dp_exposed_s=0.0, opt_s_per_element=0.0,
                   templates={i: 0 for i in range(8)}, inventory=_Inventory(),
                   num_layers=8)
    # pp 2 × vp 2: stages of 2 layers, backward v0 = 2·2 + 1 = 5, v1 = v2 = 4, v3 = 4 + 4 = 8;
    # rank 0 holds v0, v2 and rank 1 v1, v3. Window = the last chunk's backward + pp × the
    # others': rank 0 4 + 2·5 = 14, rank 1 8 + 2·4 = 16. Transient: rank 0 max(10, 10) = 10,
    # rank 1 (the head) 50
    split = _geometry(g, 2, 2)
    assert split.b == [5.0, 4.0, 4.0, 8.0]
    assert split.window == [14.0, 16.0]
    assert split.transient == [10.0, 50.0]
    assert split.dense == [4, 4]
    # pp 2, one chunk each: the window is the stage's backward, 4·2 + 1 = 9 and 8 + 4 = 12
    split = _geometry(g, 2, 1)
    assert split.window == [9.0, 12.0]
    assert split.transient == [10.0, 50.0]


class _Report:
    """What :func:`with_optimizer` reads of an anchor's ``TrainingReport``."""

    def __init__(self, collectives: dict) -> None:
        self.optimizer_s = 0.0
        self.exposed_comm_s = {"dp": 0.5}
        self.hidden_comm_s = {"dp": 1.5}
        self.collectives = collectives


@pytest.mark.needs("zrt-nvidia")
def test_gradient_sync_per_element_scaled_to_a_layouts_groups() -> None:
    from zrt_core.cost.collectives import collective_cost
    from zrt_core.plugins import get_plugin_manager
    from zrt_core.search.screen_model import GroupModel, _sync_s, with_optimizer
    from zrt_core.strategy import Parallel

    hw = get_plugin_manager().hardware_spec("h100")
    # the anchor: tp 8 × pp 16 × dp 8 (1,024 GPUs), ZeRO-1; its backward reduce-scatters
    # 10 buckets of 400 MB over dp in 2 s for 10⁹ parameter elements (over its ranks); the
    # all-gather (the optimizer's parameter gather) is not a gradient reduction: left out
    table = {"backward/dp/reduce_scatter": {"calls": 10, "bytes": 4e9, "time_s": 2.0},
             "backward/dp/all_gather": {"calls": 10, "bytes": 2e9, "time_s": 9.0}}
    g = GroupModel(fwd_s={}, bwd_s={}, act_bytes={}, transient_bytes={}, p2p_s=0.0,
                   dp_exposed_s=0.0, opt_s_per_element=0.0, templates={},
                   inventory=_Inventory(), num_layers=1,
                   dp_sync=(("dp", "reduce_scatter", 10, 4e9),))
    anchor = Parallel(tp=8, pp=16, dp=8)
    screened = Screened(step_s=1.0, tokens_per_s_per_gpu=1.0, memory_bytes=0.0,
                        usable_bytes=1.0, opt_elements=1.0, rank_elements=1e8,
                        total_elements=1e9)
    g = with_optimizer(g, _Report(table), screened, anchor, True, hw)
    # the anchor's per-element dp time (exposed + hidden over its worst rank's elements)
    # stays for FSDP: (0.5 + 1.5) / 10⁸
    assert g.dp_s_per_element == pytest.approx(2e-8)
    # on the anchor's own groups: 2 s / 10⁹ elements
    assert g.sync_s_per_element * _sync_s(g, anchor, True, hw) == pytest.approx(2e-9)
    # on tp 8 × pp 1 × dp 128: ten 400 MB reduce-scatters over 128 ranks spread over all
    # 1,024, against ten over 8 spread over 64 (the anchor's), times the anchor's rate
    wide = Parallel(tp=8, pp=1, dp=128)
    ratio = collective_cost("reduce_scatter", 4e8, 128, 1024, hw).time_s / \
        collective_cost("reduce_scatter", 4e8, 8, 64, hw).time_s
    assert g.sync_s_per_element * _sync_s(g, wide, True, hw) == pytest.approx(2e-9 * ratio)
    assert ratio > 1.0
    # ZeRO-0 all-reduces the same buckets
    ar = collective_cost("all_reduce", 4e8, 128, 1024, hw).time_s * 10
    assert _sync_s(g, wide, False, hw) == pytest.approx(ar)
    # an anchor without a gradient reduction (dp 1): the per-element time as it was
    bare = with_optimizer(g, _Report({}), screened, Parallel(tp=8, pp=128), True, hw)
    assert bare.dp_sync == ()


def test_anchor_is_the_most_stages_of_two_layers_or_more() -> None:
    from zrt_core.search.screen import _anchor_order
    from zrt_core.strategy import Parallel

    class _T:
        def __init__(self, pp: int, vp: int, schedule: str) -> None:
            self.parallel = Parallel(pp=pp, vp=vp)
            self.pp_schedule = schedule

    # 8 layers: pp 8 (8 stages of one layer), pp 2 × vp 2 (4 of two), pp 2 (2 of four),
    # pp 4 × vp 2 (8 of one): the 4-stage split first, then 2, then the one-layer splits
    cands = [_T(8, 1, "1f1b"), _T(2, 2, "interleaved"), _T(2, 1, "1f1b"),
             _T(4, 2, "interleaved")]
    assert _anchor_order([0, 1, 2, 3], cands, 8) == [1, 2, 0, 3]
    # the layer count unknown: the most stages first
    assert _anchor_order([0, 1, 2, 3], cands, None) == [0, 3, 1, 2]


class _Group:
    def __init__(self, dense: int) -> None:
        self.dense = self.total = dense
        self.expert = 0


@pytest.mark.needs("zrt-nvidia")
def test_fsdp_first_forward_gather_delay_in_closed_form() -> None:
    from zrt_core.cost.collectives import collective_cost
    from zrt_core.fsdp import ShardGroup
    from zrt_core.plugins import get_plugin_manager
    from zrt_core.search.screen_model import GroupModel, _gather_delay_s, _geometry

    hw = get_plugin_manager().hardware_spec("h100")
    inv = _Inventory()
    inv.layers = {0: _Group(10 ** 8)}  # 10⁸ bf16 elements per layer: 200 MB to gather
    shard = ShardGroup(size=64, span=64)
    gather = collective_cost("all_gather", 2e8, 64, 64, hw).time_s

    class _Plan:
        def __init__(self) -> None:
            self.shard = self.expert_shard = shard

    def delay(fwd: float) -> float:
        g = GroupModel(fwd_s={0: fwd, "embedding": 0.0}, bwd_s={0: 0.0}, act_bytes={0: 0.0},
                       transient_bytes={}, p2p_s=0.0, dp_exposed_s=0.0,
                       opt_s_per_element=0.0, templates={i: 0 for i in range(4)},
                       inventory=inv, num_layers=4)
        # pp 2: stages of 2 layers
        return _gather_delay_s(g, _geometry(g, 2, 1), _Plan(), 2.0, hw)

    # forwards much longer than a gather: only the first layer's gather is exposed; the
    # second stage's own first gather hides under the first stage's forwards (2 × 1 s)
    assert delay(1.0) == pytest.approx(gather)
    # forwards of nothing: the gathers run back to back, 2 per stage, and the second
    # stage waits for nothing before it (the stages before it take no time)
    assert delay(0.0) == pytest.approx(2 * gather)
    # forwards of half a gather: layer 0 starts after one gather and layer 1 after two
    # (its gather, issued when layer 0 starts, ends at 2·G): the stage ends at 2.5·G
    # against 1·G of forwards, 1.5·G late; stage 2 hides 1·G of it under stage 1's forwards
    assert delay(gather / 2) == pytest.approx(1.5 * gather)


@pytest.mark.needs("zrt-nvidia")
def test_fsdp_regathers_bound_a_resharded_layouts_step() -> None:
    # FSDP re-sharded after forward (pp 1) gathers every layer before its forward and again
    # before its backward, and reduce-scatters its gradients, every micro-batch, one
    # collective at a time on the data-parallel stream: that stream's sum bounds the step
    from zrt_core.cost.collectives import collective_cost
    from zrt_core.fsdp import ShardGroup
    from zrt_core.plugins import get_plugin_manager
    from zrt_core.search.screen_model import GroupModel, _regather_busy_s
    from zrt_core.strategy import Parallel

    hw = get_plugin_manager().hardware_spec("h100")
    inv = _Inventory()
    inv.layers = {0: _Group(10 ** 8)}  # 10⁸ elements per layer, 4 layers of one template
    inv.trainable = None
    whole, eight = ShardGroup(size=64, span=64), ShardGroup(size=8, span=8)
    parallel = Parallel(dp=64)
    gather = collective_cost("all_gather", 2e8, 64, 64, hw).time_s        # bf16: 200 MB
    gather8 = collective_cost("all_gather", 2e8, 8, 8, hw).time_s
    scatter = collective_cost("reduce_scatter", 4e8, 64, 64, hw).time_s   # fp32: 400 MB

    class _Plan:
        def __init__(self, reshard: str) -> None:
            self.shard = self.expert_shard = whole
            self.post_forward = self.expert_post_forward = eight
            self.reshard, self.replicas = reshard, 1

    def busy(reshard: str, rs_bytes: float) -> float:
        g = GroupModel(fwd_s={0: 0.0}, bwd_s={0: 0.0}, act_bytes={0: 0.0},
                       transient_bytes={}, p2p_s=0.0, dp_exposed_s=0.0,
                       opt_s_per_element=0.0, templates={i: 0 for i in range(4)},
                       inventory=inv, num_layers=4)
        return _regather_busy_s(g, _Plan(reshard), parallel, 2.0, rs_bytes, hw)

    # 4 layers × (a forward gather + a backward gather + a reduce-scatter)
    assert busy("full", 4.0) == pytest.approx(4 * (2 * gather + scatter))
    # re-sharded to 8 ranks: the backward gathers within them
    assert busy("partial", 4.0) == pytest.approx(4 * (gather + gather8 + scatter))
    # gradients reduced once per step, not per micro-batch: the gathers alone
    assert busy("full", 0.0) == pytest.approx(4 * 2 * gather)
    # nothing trainable in the layers (adapters elsewhere): no layer gradient to reduce
    inv.trainable = _Inventory()
    inv.trainable.layers = {0: _Group(0)}
    assert busy("full", 4.0) == pytest.approx(4 * 2 * gather)


@pytest.mark.parametrize(("pp", "vp"), [(4, 1), (4, 2), (8, 5), (2, 8)])
def test_pipeline_closed_form_is_the_simulation_for_even_chunks_and_a_heavy_head(
        pp: int, vp: int) -> None:
    # Chunks of f = 1, b = 2 and the head's chunk three times that (the rank holding it is
    # the bottleneck): 1F1B takes (m − 1) × the bottleneck rank's work + every stage once;
    # interleaved m × the bottleneck's work + the first pp − 1 stages (the head's rank
    # waits for their forwards before its first chunk and their backwards after its last);
    # each of the first micro-batch's 2 (pp·vp − 1) hops adds its P2P.
    from zrt_core.schedule.pipeline import StageTimes, simulate
    from zrt_core.search.screen_model import _Split, pipeline_closed_form

    n, m, p2p = pp * vp, 16, 0.01
    f, b = [1.0] * n, [2.0] * n
    f[-1], b[-1] = 3.0, 6.0
    mine = [[v for v in range(n) if v % pp == r] for r in range(pp)]
    split = _Split(f=f, b=b, a=[0.0] * n, mine=mine, dense=[0] * pp, expert=[0] * pp,
                   largest=[0] * pp, transient=[0.0] * pp, window=[0.0] * pp,
                   work=max(sum(f[v] + b[v] for v in r) for r in mine),
                   chunks=sum(f) + sum(b))
    schedule = "interleaved" if vp > 1 else "1f1b"
    sim = simulate(schedule, StageTimes(f, b), pp=pp, vp=vp, microbatches=m, p2p_s=p2p)
    assert sim.total_s == pytest.approx(pipeline_closed_form(split, pp, vp, m)
                                        + 2 * (n - 1) * p2p, rel=1e-12)


@pytest.mark.needs("zrt-nvidia")
def test_p2p_priced_per_boundary_on_the_first_micro_batchs_way() -> None:
    # H100: 8 GPUs on NVLink (450 GB/s at 0.8, 2 µs), InfiniBand between them (50 GB/s at
    # 0.9, 5 µs). pp 4 stages 4 ranks apart: boundaries 0→1 and 2→3 inside a node, 1→2
    # and the wrap 3→0 across. pp 4 × vp 2: hops from stage v on rank v mod 4, v = 0..6:
    # NVLink, IB, NVLink, wrap (IB), NVLink, IB, NVLink — 4 NVLink and 3 IB, each way.
    from zrt_core.plugins import get_plugin_manager
    from zrt_core.search.screen_model import GroupModel, _p2p_chain_s
    from zrt_core.strategy import Parallel

    hw = get_plugin_manager().hardware_spec("h100")
    g = GroupModel(fwd_s={}, bwd_s={}, act_bytes={}, transient_bytes={}, p2p_s=0.0,
                   dp_exposed_s=0.0, opt_s_per_element=0.0, templates={}, inventory=None,
                   num_layers=8, p2p_bytes=1e8)
    nvlink = 2e-6 + 1e8 / (450e9 * 0.8)
    ib = 5e-6 + 1e8 / (50e9 * 0.9)
    assert _p2p_chain_s(g, Parallel(tp=4, pp=4), 2, hw) == pytest.approx(
        2 * (4 * nvlink + 3 * ib), rel=1e-12)
    # 1F1B (vp 1): each boundary once each way, the wrap never
    assert _p2p_chain_s(g, Parallel(tp=4, pp=4), 1, hw) == pytest.approx(
        2 * (2 * nvlink + ib), rel=1e-12)


def test_the_anchors_pipeline_error_stays_with_its_shape() -> None:
    # exact step 10 s of which the simulated pipeline 8 s; the closed form 9.5 s of which
    # 7.6 s pipeline: 0.4 s belongs to the anchor's pipeline shape, 0.1 s to every layout
    from zrt_core.search.screen_model import GroupModel, Screened, with_residual

    class _Report:
        step_time_s, pipeline_s = 10.0, 8.0

    g = GroupModel(fwd_s={}, bwd_s={}, act_bytes={}, transient_bytes={}, p2p_s=0.0,
                   dp_exposed_s=0.0, opt_s_per_element=0.0, templates={}, inventory=None,
                   num_layers=8)
    anchor = Screened(step_s=9.5, tokens_per_s_per_gpu=1.0, memory_bytes=0.0,
                      usable_bytes=1.0, opt_elements=0.0, pipeline_s=7.6)
    out = with_residual(g, _Report(), anchor, ("interleaved", 8, 5, 16))
    assert out.residual_s == pytest.approx(0.1)
    assert out.pipeline_residual_s == pytest.approx(0.4)
    assert out.anchor_shape == ("interleaved", 8, 5, 16)


def test_the_anchors_exposed_dp_floor_scales_with_the_layouts_sync() -> None:
    # the anchor exposed 0.15 s of data-parallel time with a 0.6 s gradient sync on its
    # worst rank: a layout syncing 0.15 s (a quarter) has a floor of 0.15 / 4 = 0.0375 s;
    # one syncing more than the anchor keeps the anchor's 0.15 s; without the anchor's
    # sync (no gradient reduction), the anchor's exposed time as it is
    from zrt_core.search.screen_model import GroupModel, dp_exposed_floor_s

    g = GroupModel(fwd_s={}, bwd_s={}, act_bytes={}, transient_bytes={}, p2p_s=0.0,
                   dp_exposed_s=0.15, opt_s_per_element=0.0, templates={}, inventory=None,
                   num_layers=8, anchor_sync_s=0.6)
    assert dp_exposed_floor_s(g, 0.15) == pytest.approx(0.0375)
    assert dp_exposed_floor_s(g, 0.0) == 0.0
    assert dp_exposed_floor_s(g, 2.0) == pytest.approx(0.15)
    bare = GroupModel(fwd_s={}, bwd_s={}, act_bytes={}, transient_bytes={}, p2p_s=0.0,
                      dp_exposed_s=0.15, opt_s_per_element=0.0, templates={},
                      inventory=None, num_layers=8)
    assert dp_exposed_floor_s(bare, 0.01) == pytest.approx(0.15)


def test_host_launches_wait_per_stage_not_per_layer() -> None:
    from zrt_core.estimate.host import HostModel, LayerHost
    from zrt_core.search.screen_model import GroupModel, HostTables, _geometry

    # 8 dense layers (no MoE sync): each launches 50 forward and 100 backward kernels at
    # 10 µs, 1.5 ms of host time against 1 ms of device time (0.4 forward + 0.6 backward);
    # the outside-layers part 10 launches (0.1 ms) against 6 ms of device time (the head)
    host = HostTables(model=HostModel(launch_s=10e-6),
                      fwd={0: LayerHost(50, 0.0), None: LayerHost(5, 0.0)},
                      bwd={0: (100, 0.0), None: (5, 0.0)})
    g = GroupModel(fwd_s={0: 0.4e-3, "embedding": 0.0, "head": 2e-3},
                   bwd_s={0: 0.6e-3, "embedding": 0.0, "head": 4e-3},
                   act_bytes={0: 0.0}, transient_bytes={}, p2p_s=0.0, dp_exposed_s=0.0,
                   opt_s_per_element=0.0, templates={i: 0 for i in range(8)},
                   inventory=_Inventory(), num_layers=8, host=host)
    # pp 2, stages of 4 layers. Stage 0: host 4 × 1.5 + 0.1 = 6.1 ms against 4 ms of
    # device: the backward waits 2.1 ms. Stage 1 holds the head: host 6.1 ms against
    # 4 + 6 = 10 ms, nothing waits
    split = _geometry(g, 2, 1)
    assert split.f == pytest.approx([1.6e-3, 3.6e-3])
    assert split.b == pytest.approx([2.4e-3 + 2.1e-3, 6.4e-3])
    # pp 4 (2 layers each): stage 0 waits 3.1 − 2 = 1.1 ms, the middle stages 3 − 2 = 1 ms
    # each, the last none (3.1 against 8 ms): 3.1 ms in all, against the 2.1 ms of pp 2,
    # where the head's stage hid the launches of its layers
    split = _geometry(g, 4, 1)
    assert [b - d for b, d in zip(split.b, [1.2e-3, 1.2e-3, 1.2e-3, 5.2e-3],
                                  strict=True)] == pytest.approx([1.1e-3, 1e-3, 1e-3, 0.0])
