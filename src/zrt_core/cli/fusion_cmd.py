"""``zrt fusion discover MODEL``: draft a fusion-rule pack for a model from its captured
graphs (:mod:`zrt_core.transforms.fusion.discover`); ``--fusion-rules FILE`` loads it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from zrt_core.cli._output import add_json_flag, console, print_json, table
from zrt_core.errors import ZrtError

PLATFORM_CHOICES = ("cuda", "ascend", "generic")


def register(sub: Any) -> None:
    p = sub.add_parser("fusion", help="fusion rules: draft a pack for a model",
                       description="Fusion-rule packs (docs/fusion.md).")
    actions = p.add_subparsers(dest="fusion_command", metavar="ACTION")
    d = actions.add_parser(
        "discover", help="draft a fusion-rule pack for a model",
        description="Capture the model's four phases, group each module's consecutive ops "
        "(merged into a parent module of at most 30 ops), and write one rule per module "
        "class in zrt's rule-pack format. Candidates the installed packs of the platform "
        "already fuse are written commented out. Load the file with --fusion-rules FILE.")
    d.add_argument("model", metavar="MODEL",
                   help="bundled name (zrt models), config.json or its directory, or a "
                        "HuggingFace id in the local cache")
    d.add_argument("--platform", choices=PLATFORM_CHOICES, default="cuda",
                   help="the platform the pack targets, whose installed packs mark what is "
                        "covered (default cuda)")
    d.add_argument("-o", "--out", metavar="FILE",
                   help="write the pack here (default: print the YAML)")
    d.add_argument("--include-covered", action="store_true",
                   help="write covered candidates as active rules too (they then run ahead "
                        "of the installed rules that fuse them today)")
    add_json_flag(d)
    d.set_defaults(func=run_discover)
    p.set_defaults(func=lambda _args: p.error("choose an action: discover"))


def run_discover(args: argparse.Namespace) -> int:
    from zrt_core.capture.sources import check_capture_request
    from zrt_core.plugins import get_plugin_manager
    from zrt_core.transforms.fusion.discover import DISCOVERY_SEQ_LEN, discover_model

    host = get_plugin_manager()
    check_capture_request(args.model, ("prefill", "decode", "train_forward",
                                       "train_backward"), DISCOVERY_SEQ_LEN, host)
    out = Path(args.out) if args.out else None
    if out is not None and out.is_dir():
        raise ZrtError(f"-o {out} is a directory", "give a file name such as rules.yaml")
    found = discover_model(args.model, host, args.platform, label=args.model)
    text = found.to_yaml(include_covered=args.include_covered)
    if out is not None:
        try:
            out.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise ZrtError(f"-o {out}: cannot write ({exc.strerror or exc})",
                           "pick a writable path") from None
    if args.json:
        data = found.to_json()
        if out is not None:
            data["file"] = str(out)
        else:
            data["yaml"] = text
        print_json(data)
        return 0
    if out is None:
        sys.stdout.write(text)
        return 0
    con = console()
    rows = [(c.name, c.module_class + (" (+ sub-modules)" if c.descendants else ""),
             ",".join(_short(p) for p in c.phases), str(c.max_ops), c.anchor or "",
             c.status, ", ".join(c.covered_by))
            for c in found.candidates if c.status not in ("single", "unscoped")]
    con.print(table(
        f"fusion candidates · {args.model} · {args.platform}",
        ("rule", "module", "phases", "ops", "anchor", "status", "installed rules"), rows,
        justify=("left", "left", "left", "right", "left", "left", "left")))
    count = {k: sum(1 for c in found.candidates if c.status == k)
             for k in ("covered", "inert", "single", "unscoped")}
    written = len(found.rules(args.include_covered))
    covered = "" if args.include_covered else (
        f", {count['covered']} covered by {', '.join(found.covered_packs)} written commented "
        "out" if count["covered"] else "")
    con.print(f"wrote {out}: {written} rules{covered}; left out: {count['inert']} that fuse "
              f"nothing in this model, {count['single'] + count['unscoped']} with one op "
              "or no class")
    return 0


def _short(phase: str) -> str:
    return {"prefill": "P", "decode": "D", "train_forward": "F",
            "train_backward": "B"}.get(phase, phase)
