"""``zrt run``'s MoE routing flags (``--moe-imbalance``, ``--eplb``) and multi-token
prediction (``--mtp``): parsing into :class:`~zrt_core.moe_load.ExpertLoad` and
the checks that need no model (docs/moe-training.md, docs/inference-model.md)."""

from __future__ import annotations

import argparse
from typing import Any

from zrt_core.errors import SpecError


def add_moe_args(g: Any) -> None:
    """Add the MoE routing flags to the parallel-layout group ``g``."""
    g.add_argument("--moe-imbalance", default=None, metavar="X|dist:NAME",
                   help="MoE routing skew under EP: X >= 1 gives the busiest expert X times "
                        "the mean load; dist:multinomial draws each step's routing at random "
                        "(the busiest EP rank's expected load at the step's token count); "
                        "dist:deepseek-sglang draws the experts' popularities from a "
                        "measured DeepSeek skew (docs/moe-training.md), then each step's "
                        "routing; default balanced")
    g.add_argument("--eplb", type=_count("--eplb"), default=0, metavar="N",
                   help="serving: N redundant experts placed as DeepSeek's EPLB places them "
                        "(replicate the heaviest, pack balanced over the EP ranks)")


def add_mtp_args(p: Any) -> None:
    """Add ``--mtp`` (both modes) and ``--mtp-acceptance`` (serving) in their own group."""
    g = p.add_argument_group("multi-token prediction (--train and --infer)")
    g.add_argument("--mtp", type=_count("--mtp"), default=None, metavar="N",
                   help="--train: train N MTP modules, each a block of the last layer kind "
                        "with its own LM head and loss (overrides the config's "
                        "num_nextn_predict_layers; default none). --infer: speculative "
                        "decoding with the model's MTP head, N draft tokens a step verified "
                        "in one forward (needs --batch and a config with MTP layers)")
    g.add_argument("--mtp-acceptance", type=_probability, default=None, metavar="P",
                   help="--infer --mtp: probability a draft token is accepted (default 0.85: "
                        "DeepSeek-V3 report, 85-90%% for the second token)")


def serve_with_mtp(args: argparse.Namespace, report: Any, config: Any, hw: Any,
                   parallel: Any, infer: Any, host: Any) -> Any:
    """``report`` under MTP speculative decoding (:mod:`zrt_core.estimate.speculative`)."""
    from attrs import evolve

    from zrt_core.estimate import estimate_inference
    from zrt_core.estimate.speculative import DEFAULT_ACCEPTANCE, with_mtp

    n = args.mtp
    if n is None:
        raise SpecError("--mtp-acceptance needs --mtp N (draft tokens a step)",
                        "add --mtp 1, or drop --mtp-acceptance")
    if n == 0:
        return report
    if args.batch is None:
        raise SpecError("--mtp in serving prices a fixed batch", "give --batch B")
    wide = estimate_inference(args.model, hw, parallel, evolve(infer, batch=args.batch * (n + 1)),
                              host=host, engine=args.engine,
                              use_cache=False if args.no_cache else None)
    acceptance = DEFAULT_ACCEPTANCE if args.mtp_acceptance is None else args.mtp_acceptance
    return with_mtp(report, wide, n, acceptance, config)


def mtp_from_args(args: argparse.Namespace, config: Any) -> tuple[Any, Any]:
    """``(config, MtpSpec | None)`` for ``--mtp N``: the config with
    ``num_nextn_predict_layers = N`` and the MTP that Megatron-Bridge trains for it; without
    the flag the config unchanged and None (no MTP modules, as before the flag)."""
    if getattr(args, "mtp_acceptance", None) is not None:
        raise SpecError("--mtp-acceptance is a serving flag (speculative decoding)",
                        "drop it with --train")
    n = getattr(args, "mtp", None)
    if n is None:
        return config, None
    from zrt_core.estimate.training import mtp_at_depths

    return mtp_at_depths(config, n)


def moe_load_from_args(args: argparse.Namespace) -> Any:
    """The run's :class:`ExpertLoad`, or None for balanced routing without EPLB."""
    from zrt_core.moe_load import ExpertLoad

    text = getattr(args, "moe_imbalance", None)
    redundant = int(getattr(args, "eplb", 0) or 0)
    if text is None and not redundant:
        return None
    if redundant and (args.mode or "infer") == "train":
        raise SpecError("--eplb is a serving load balancer (DeepSeek-V3 deploys redundant "
                        "experts for inference; Megatron-Core trains without replicas); it "
                        "does not apply to --train",
                        "drop --eplb; model a routing skew with --moe-imbalance X or "
                        "dist:multinomial, or use --infer")
    load = ExpertLoad.parse(text if text is not None else "1", redundant=redundant)
    return None if load.is_default else load


def _count(flag: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = -1
        if value < 0:
            raise argparse.ArgumentTypeError(f"{flag} must be a count >= 0, got {text!r}")
        return value

    return parse


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"--mtp-acceptance must be a probability from 0 to "
                                         f"1, got {text!r}")
    return value
