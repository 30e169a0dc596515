"""Which decoder (and MTP) layers each virtual pipeline stage holds, by Megatron-Core's rules:
an even split, uneven first/last stages, the embedding/loss accounting, or a layout string."""

from __future__ import annotations

import re

from attrs import field, frozen, validators

from zrt_core.errors import LayoutError

#: Megatron-Core's layout characters (``PipelineParallelLayerLayout.parse_str_to_list``).
LAYOUT_CHARS = {"E": "embedding", "L": "loss", "t": "decoder", "m": "mtp"}

_optional_positive = validators.optional(validators.and_(validators.instance_of(int),
                                                         validators.ge(1)))


@frozen
class StageSplit:
    """How a run splits its layers into pipeline stages, as Megatron-Core is told.

    :param first_layers: ``--decoder-first-pipeline-num-layers`` (``num_layers_in_first_
        pipeline_stage``): decoder layers on pipeline rank 0, over its ``vp`` chunks.
    :param last_layers: ``--decoder-last-pipeline-num-layers``: those of the last rank.
    :param layout: ``--pipeline-model-parallel-layout``, e.g. ``"Et|(tt|)*30mL"``: one
        ``|``-separated entry per virtual stage in model order, ``E`` embedding, ``t`` a
        decoder layer, ``m`` an MTP layer, ``L`` the loss; ``(...)*n`` and ``x*n`` repeat.
    :param embedding_loss: ``account_for_embedding_in_pipeline_split`` and
        ``account_for_loss_in_pipeline_split``: the embedding and the loss count as one
        layer each in the split.
    :param fallback: where Megatron-Core's rules refuse the layers (no even split, nor one
        with the embedding and the loss counted), assume the layout that balances every
        layout entry — the embedding, each decoder and MTP layer, the loss — over the
        stages, and say so (validation records that do not publish their layout).
    """

    first_layers: int | None = field(default=None, validator=_optional_positive)
    last_layers: int | None = field(default=None, validator=_optional_positive)
    layout: str | None = None
    embedding_loss: bool = False
    fallback: bool = False

    def __attrs_post_init__(self) -> None:
        uneven = self.first_layers is not None or self.last_layers is not None
        if self.layout is not None and (uneven or self.embedding_loss):
            raise LayoutError(
                "a pipeline layout cannot be combined with first/last stage layer counts or "
                "the embedding/loss accounting (Megatron-Core's rule)",
                "give either --pipeline-model-parallel-layout or the other options")
        if uneven and self.embedding_loss:
            raise LayoutError(
                "first/last stage layer counts cannot be combined with the embedding/loss "
                "accounting (Megatron-Core's rule)",
                "drop --embedding-loss-stages or the first/last counts")

    @classmethod
    def parse(cls, value: StageSplit | str | None) -> StageSplit:
        """A :class:`StageSplit` from itself, ``"even"`` (Megatron's default),
        ``"embedding-loss"`` or ``"auto"`` (the records' default: even, else the
        embedding/loss accounting, else the balanced layout)."""
        if isinstance(value, StageSplit):
            return value
        if value in (None, "even"):
            return cls()
        if value == "embedding-loss":
            return cls(embedding_loss=True)
        if value == "auto":
            return cls(fallback=True)
        raise LayoutError(f"unknown stage split {value!r}",
                          "use even, embedding-loss, auto or a StageSplit")

    def describe(self) -> str:
        if self.layout is not None:
            return f"layout {self.layout}"
        if self.first_layers is not None or self.last_layers is not None:
            return f"first {self.first_layers}, last {self.last_layers} layers"
        return "embedding-loss" if self.embedding_loss else ("auto" if self.fallback else "even")


@frozen
class StagePlan:
    """The layers of each virtual stage, model order: decoder layers ``0..num_layers-1``,
    then the MTP layers (``num_layers..``), each a contiguous (possibly empty) range; the
    first stage holds the embedding, the last the final norm, head and loss.

    :param layout: the same plan as a Megatron-Core layout string.
    :param note: how the split was chosen, when it was not what the run asked for plainly.
    """

    ranges: tuple[range, ...]
    layout: str
    note: str | None = None

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(len(r) for r in self.ranges)


def parse_layout(layout: str) -> list[str]:
    """A layout string as one string of layer characters per virtual stage (Megatron-Core's
    grammar: commas are cosmetic, ``(...)*n`` then ``x*n`` are unrolled, ``|`` ends a
    stage).

    >>> parse_layout("Et*3|(tt|)*2,m|L")
    ['Ettt', 'tt', 'tt', 'm', 'L']
    """
    text = layout.replace(",", "").replace(" ", "")
    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    text = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    stages = text.split("|")
    bad = sorted({c for c in text if c not in LAYOUT_CHARS and c != "|"})
    if bad:
        raise LayoutError(f"pipeline layout {layout!r} has unknown characters {''.join(bad)!r}",
                          "use E (embedding), t (decoder layer), m (MTP layer), L (loss), "
                          "| between stages, (...)*n and x*n to repeat")
    return stages


def render_layout(stages: list[str]) -> str:
    """Stage strings as a compact layout string (runs of stages as ``(...|)*n``)."""
    def one(s: str) -> str:
        return re.sub(r"t{5,}", lambda m: f"t*{len(m.group(0))}", s)

    out: list[str] = []
    i = 0
    while i < len(stages):
        j = i
        while j + 1 < len(stages) and stages[j + 1] == stages[i]:
            j += 1
        count = j - i + 1
        last = j == len(stages) - 1
        if count > 1 and not last:
            out.append(f"({one(stages[i])}|)*{count}")
        elif count > 1:
            out.append(f"({one(stages[i])}|)*{count - 1}{one(stages[i])}")
        else:
            out.append(one(stages[i]) + ("" if last else "|"))
        i = j + 1
    return "".join(out)


def balanced_layout(num_layers: int, stages: int, mtp_depths: int = 0) -> str | None:
    """The layout string that spreads the embedding, the decoder layers, the MTP layers and
    the loss, one entry each, over ``stages`` as evenly as counts allow (the extra entries
    on the middle stages), for runs whose framework places layers itself rather than by
    Megatron-Core's rules; None when there are fewer entries than stages."""
    entries = "E" + "t" * num_layers + "m" * mtp_depths + "L"
    base, extra = divmod(len(entries), stages)
    if base == 0:
        return None
    order = [*range(1, stages - 1), 0, stages - 1] if stages > 2 else list(range(stages))
    sizes = [base] * stages
    for v in order[:extra]:
        sizes[v] += 1
    chunks, start = [], 0
    for size in sizes:
        chunks.append(entries[start:start + size])
        start += size
    return render_layout(chunks)


def auto_splits(num_layers: int, pp: int, vp: int, mtp_depths: int = 0) -> bool:
    """Whether Megatron-Core splits ``num_layers`` decoder layers (and ``mtp_depths`` MTP
    depths) over pp × vp stages with no split given: :func:`plan_stages` with ``"auto"``
    (even, else the embedding and the loss counted as layers, else the balanced layout)
    accepts it."""
    try:
        plan_stages(num_layers, pp * vp, pp, "auto", mtp_depths=mtp_depths)
    except LayoutError:
        return False
    return True


def plan_stages(num_layers: int, stages: int, pp: int, split: StageSplit | str | None = None,
                *, mtp_depths: int = 0, mtp_layers_per_depth: int = 1,
                rank_major: bool = True) -> StagePlan:
    """Assign the decoder and MTP layers to ``stages`` virtual stages (``pp`` ranks).

    Megatron-Core's rules, each refusal a :class:`LayoutError` naming it:

    - **even** (no option): ``pp`` divides the layers and ``vp = stages / pp`` divides the
      layers per rank (``get_num_layers_to_build``); MTP layers on the last stage.
    - **first/last** (``num_layers_in_first/last_pipeline_stage``): the first (last) rank
      holds that many layers, ``1/vp`` of them in each of its chunks; the middle ranks
      share the rest evenly; each count divisible by ``vp``
      (``TransformerConfig.__post_init__``, ``get_transformer_layer_offset``). Defined for
      schedules whose stage ``v`` runs on rank ``v mod pp`` (``rank_major``).
    - **embedding/loss**: ``layers + 2`` split evenly, the first stage one layer short for
      the embedding, the last one short for the loss (zero layers allowed, as
      ``get_num_layers_to_build`` asserts ``>= 0``); MTP layers are not counted.
    - **layout**: ``PipelineParallelLayerLayout.validate_layer_layout``: one entry per
      virtual stage, the embedding first and the loss last, exactly once each, every
      decoder layer, as many ``m`` as MTP depths, all after the decoder layers and in one
      stage; on rank-major schedules that stage is the last chunk of its rank.

    :param stages: virtual stages of the schedule (``pp`` · ``vp`` interleaved, ``2·pp`` for
        the V shapes, else ``pp``).
    :param mtp_depths: MTP modules the run trains; each is ``mtp_layers_per_depth``
        captured layers.
    :param rank_major: the schedule places stage ``v`` on rank ``v mod pp``.
    """
    split = StageSplit.parse(split)
    if stages < 1 or pp < 1 or stages % pp:
        raise LayoutError(f"{stages} virtual stages over pp={pp} ranks",
                          "pp must divide the virtual stages")
    vp = stages // pp
    if split.layout is not None:
        return _from_layout(split.layout, num_layers, stages, pp, mtp_depths,
                            mtp_layers_per_depth, rank_major)
    if split.first_layers is not None or split.last_layers is not None:
        if not rank_major:
            raise LayoutError("first/last stage layer counts are Megatron's for 1F1B-family "
                              "schedules (stage v on rank v mod pp)",
                              "give the split as --pipeline-model-parallel-layout")
        sizes = _uneven_sizes(num_layers, pp, vp, split.first_layers, split.last_layers)
        return _plan(sizes, num_layers, mtp_depths, mtp_layers_per_depth, mtp_stage=None)
    if num_layers % stages == 0 and not split.embedding_loss:
        return _plan([num_layers // stages] * stages, num_layers, mtp_depths,
                     mtp_layers_per_depth, mtp_stage=None)
    even_rule = (f"pp × vp = {stages} does not divide the {num_layers} layers "
                 "(Megatron-Core's even split)")
    if split.embedding_loss or split.fallback:
        padded = num_layers + 2
        if padded % stages == 0:
            per = padded // stages
            sizes = [per] * stages
            sizes[0] -= 1
            sizes[-1] -= 1
            note = None
            if split.fallback:
                note = (f"{num_layers} layers over pp × vp = {stages} stages: the embedding "
                        "and the loss counted as one layer each (Megatron-Core's "
                        "account_for_embedding/loss_in_pipeline_split, as Megatron-Bridge "
                        "recipes set them)")
            plan = _plan(sizes, num_layers, mtp_depths, mtp_layers_per_depth, mtp_stage=None)
            return StagePlan(plan.ranges, plan.layout, note)
        if not split.fallback:
            raise LayoutError(
                f"pp × vp = {stages} does not divide the {padded} layers with the embedding "
                "and the loss counted as layers (Megatron-Core's "
                "account_for_embedding/loss_in_pipeline_split)",
                "choose pp and vp that divide layers + 2, or give the split as "
                "--decoder-first/last-pipeline-num-layers or --pipeline-model-parallel-layout")
        entries = num_layers + mtp_depths + 2  # embedding, decoder, MTP, loss
        # an even split of the entries: the balanced layout with no stage one entry longer
        layout = balanced_layout(num_layers, stages, mtp_depths) \
            if entries % stages == 0 else None
        if layout is not None:
            try:
                plan = _from_layout(layout, num_layers, stages, pp, mtp_depths,
                                    mtp_layers_per_depth, rank_major)
            except LayoutError:
                pass
            else:
                return StagePlan(plan.ranges, plan.layout, (
                    f"Megatron-Core refuses {num_layers} layers over pp × vp = {stages} "
                    f"stages without a pipeline layout ({num_layers} + embedding + loss = "
                    f"{num_layers + 2} does not divide either); assumed the layout "
                    f"{layout}: the embedding, each MTP layer and the loss count as one "
                    "layer each (Megatron-Bridge's DeepSeek-V3 recipes give such layouts)"))
        raise LayoutError(
            f"{even_rule}, nor do {num_layers + 2} with the embedding and the loss counted, "
            f"nor {entries} layout entries (embedding, decoder"
            + (", MTP" if mtp_depths else "") + " layers, loss): Megatron-Core refuses it "
            "without a pipeline layout",
            "give the layout the run used (pipeline_model_parallel_layout, "
            "--pipeline-model-parallel-layout)")
    raise LayoutError(even_rule,
                      "choose pp and vp so that layers split evenly, or give the split: "
                      "--decoder-first/last-pipeline-num-layers, --pipeline-model-parallel-"
                      "layout or --embedding-loss-stages")


def _uneven_sizes(num_layers: int, pp: int, vp: int, first: int | None, last: int | None
                  ) -> list[int]:
    """Decoder layers per virtual stage (model order) with uneven first/last ranks."""
    middle_layers, middle_ranks = num_layers, pp
    for name, count in (("first", first), ("last", last)):
        if count is None:
            continue
        if count % vp:
            raise LayoutError(f"the {count} layers of the {name} pipeline stage are not "
                              f"divisible by vp={vp} (Megatron-Core's rule)",
                              f"give a multiple of {vp}")
        middle_layers -= count
        middle_ranks -= 1
    if middle_layers < 0 or bool(middle_layers) != bool(middle_ranks):
        raise LayoutError(
            f"{middle_layers} layers remain for {middle_ranks} middle pipeline stages of "
            f"{num_layers} layers with first {first} and last {last} (Megatron-Core's rule)",
            "first + last must leave layers exactly when there are middle stages")
    per_middle = 0
    if middle_ranks:
        if middle_layers % middle_ranks:
            raise LayoutError(f"the {middle_layers} middle layers do not split evenly over "
                              f"{middle_ranks} middle pipeline stages (Megatron-Core's rule)",
                              "adjust the first/last counts")
        per_middle = middle_layers // middle_ranks
        if per_middle % vp:
            raise LayoutError(f"the {per_middle} layers of each middle pipeline stage are not "
                              f"divisible by vp={vp} (Megatron-Core's rule)",
                              "adjust the first/last counts or vp")
    sizes = []
    for _chunk in range(vp):
        for rank in range(pp):
            if rank == 0 and first is not None:
                sizes.append(first // vp)
            elif rank == pp - 1 and last is not None:
                sizes.append(last // vp)
            else:
                sizes.append(per_middle // vp)
    return sizes


def _plan(sizes: list[int], num_layers: int, mtp_depths: int, per_depth: int,
          mtp_stage: int | None) -> StagePlan:
    """Ranges from decoder layers per stage, the MTP layers in ``mtp_stage`` (default the
    last)."""
    if sum(sizes) != num_layers or min(sizes) < 0:
        raise LayoutError(f"stage sizes {sizes} do not hold the {num_layers} layers")
    mtp_stage = len(sizes) - 1 if mtp_stage is None else mtp_stage
    ranges, entries = [], []
    start = 0
    for v, size in enumerate(sizes):
        extra = mtp_depths * per_depth if v == mtp_stage else 0
        ranges.append(range(start, start + size + extra))
        start += size + extra
        entries.append(("E" if v == 0 else "") + "t" * size
                       + ("m" * mtp_depths if v == mtp_stage else "")
                       + ("L" if v == len(sizes) - 1 else ""))
    return StagePlan(tuple(ranges), render_layout(entries))


def _from_layout(layout: str, num_layers: int, stages: int, pp: int, mtp_depths: int,
                 per_depth: int, rank_major: bool) -> StagePlan:
    parsed = parse_layout(layout)
    rule = f"pipeline layout {layout!r}: "
    if len(parsed) != stages:
        raise LayoutError(rule + f"{len(parsed)} stages, but the schedule runs {stages} "
                          f"virtual stages (pp × vp)",
                          "give one |-separated entry per virtual stage")
    flat = "".join(parsed)
    if not parsed[0].startswith("E") or flat.count("E") != 1:
        raise LayoutError(rule + "the embedding (E) must open the first stage, once",
                          "start the layout with E")
    if not parsed[-1].endswith("L") or flat.count("L") != 1:
        raise LayoutError(rule + "the loss (L) must close the last stage, once",
                          "end the layout with L")
    if flat.count("t") != num_layers:
        raise LayoutError(rule + f"{flat.count('t')} decoder layers (t), the model has "
                          f"{num_layers}", "give every decoder layer once")
    if flat.count("m") != mtp_depths:
        raise LayoutError(rule + f"{flat.count('m')} MTP layers (m), the run trains "
                          f"{mtp_depths}", "give as many m as MTP layers")
    mtp_stage = None
    if mtp_depths:
        holders = [v for v, s in enumerate(parsed) if "m" in s]
        if len(holders) != 1:
            raise LayoutError(rule + "all MTP layers must be in one stage",
                              "put every m in the same stage")
        mtp_stage = holders[0]
        if "t" in flat[flat.index("m"):]:
            raise LayoutError(rule + "decoder layers must come before the MTP layers",
                              "move the m entries after the last t")
        if rank_major and mtp_stage // pp != stages // pp - 1:
            raise LayoutError(rule + "the MTP layers must be in the last virtual stage of "
                              "their pipeline rank (Megatron-Core's rule)",
                              "move the m entries to one of the last pp stages")
    sizes = [s.count("t") for s in parsed]
    plan = _plan(sizes, num_layers, mtp_depths, per_depth, mtp_stage)
    return StagePlan(plan.ranges, render_layout(parsed))
