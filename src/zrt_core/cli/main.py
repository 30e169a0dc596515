"""The ``zrt`` command line.

Each command lives in its own module under ``zrt_core.cli`` with ``register(subparsers)``;
:data:`COMMANDS` lists them in help order. Bad input raises :class:`ZrtError`, printed as
one line with exit status 2; anything else is a bug, exit 1 (``ZRT_DEBUG=1`` shows the
traceback).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from zrt_core import __version__
from zrt_core.errors import ZrtError

COMMANDS = (
    "zrt_core.cli.plugins_cmd",
    "zrt_core.cli.hw_cmd",
    "zrt_core.cli.models_cmd",
    "zrt_core.cli.capture_cmd",
    "zrt_core.cli.fusion_cmd",
    "zrt_core.cli.run_cmd",
    "zrt_core.cli.estimate_cmd",
    "zrt_core.cli.validate_cmd",
    "zrt_core.cli.search_cmd",
    "zrt_core.cli.compare_cmd",
    "zrt_core.cli.calibrate_cmd",
    "zrt_core.cli.measure_cmd",
    "zrt_core.cli.diff_cmd",
    "zrt_core.cli.profile_cmd",
    "zrt_core.cli.serve_cmd",
)


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line, exit 2: ``zrt: error:`` like every
    other error (not ``zrt run: error:``), the subcommand named in the help it points to."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"zrt: error: {message} — see '{self.prog} --help'\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="zrt",
        description="Predict step time, memory and cost of training or serving an LLM "
        "from its config.json.",
    )
    parser.add_argument("--version", action="version", version=f"zrt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module_name in COMMANDS:
        importlib.import_module(module_name).register(sub)
    _add_width(parser)
    return parser


def _add_width(parser: argparse.ArgumentParser) -> None:
    """``--width N`` on every command that prints a table (every leaf command)."""
    from zrt_core.cli._output import add_width_flag

    children = _subparsers(parser)
    if not children:
        add_width_flag(parser)
    for child in children.values():
        _add_width(child)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # named by the subcommand's parser, so the hint is 'zrt run --help'
        command = getattr(args, "command", None)
        owner = _subparsers(parser).get(command, parser) if command else parser
        owner.error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from zrt_core.cli._output import set_width

    set_width(getattr(args, "width", None))
    try:
        return int(args.func(args) or 0)
    except ZrtError as exc:
        sys.stderr.write(f"zrt: error: {_one_line(str(exc))}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("zrt: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:
        if os.environ.get("ZRT_DEBUG"):
            raise
        sys.stderr.write(
            f"zrt: internal error: {type(exc).__name__}: {_one_line(str(exc))} — this is a bug "
            "in zrt; "
            "rerun with ZRT_DEBUG=1 for the traceback and report it\n"
        )
        return 1


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _one_line(text: str) -> str:
    """Messages are one line: a newline inside an exception's text becomes a space."""
    return " ".join(text.split())


if __name__ == "__main__":
    raise SystemExit(main())
