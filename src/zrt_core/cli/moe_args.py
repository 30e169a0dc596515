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
                        "default balanced")
    g.add_argument("--eplb", type=_count("--eplb"), default=0, metavar="N",
                   help="serving: N redundant experts placed as DeepSeek's EPLB places them "
                        "(replicate the heaviest, pack balanced over the EP ranks)")


def add_mtp_args(g: Any) -> None:
    """Add ``--mtp`` to the training group: the MTP modules the step trains."""
    g.add_argument("--mtp", type=_count("--mtp"), default=None, metavar="N",
                   help="multi-token prediction: train N MTP modules, each a block of the "
                        "last layer kind with its own LM head and loss (overrides the "
                        "config's num_nextn_predict_layers; default: none)")


def mtp_from_args(args: argparse.Namespace, config: Any) -> tuple[Any, Any]:
    """``(config, MtpSpec | None)`` for ``--mtp N``: the config with
    ``num_nextn_predict_layers = N`` and the MTP that Megatron-Bridge trains for it; without
    the flag the config unchanged and None (no MTP modules, as before the flag)."""
    n = getattr(args, "mtp", None)
    if n is None:
        return config, None
    from zrt_core.estimate.training import mtp_from_config

    config = {**config, "num_nextn_predict_layers": n}
    if "mtp_num_layers" in config:
        config["mtp_num_layers"] = n
    return config, mtp_from_config(config)


def moe_load_from_args(args: argparse.Namespace) -> Any:
    """The run's :class:`ExpertLoad`, or None for balanced routing without EPLB."""
    from zrt_core.moe_load import ExpertLoad

    text = getattr(args, "moe_imbalance", None)
    redundant = int(getattr(args, "eplb", 0) or 0)
    if text is None and not redundant:
        return None
    if redundant and (args.mode or "infer") == "train":
        raise SpecError("--eplb is a serving load balancer (DeepSeek-V3 deploys redundant "
                        "experts for inference); it does not apply to --train",
                        "drop --eplb, or use --infer")
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
