"""Errors a user can act on.

Every error that reaches the CLI as a :class:`ZrtError` is printed as one line (what is
wrong, then what to do) and exits with status 2. Anything else is a bug in zrt.
"""

from __future__ import annotations


class ZrtError(Exception):
    """A problem with the user's input or environment, explained in one line.

    :param message: what is wrong.
    :param hint: what to do about it; appended after " — ".
    """

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} — {self.hint}" if self.hint else self.message


class PluginError(ZrtError):
    """A plugin failed to load, or two plugins contributed the same name."""


class SpecError(ZrtError):
    """A hardware spec, rule pack or other data file is malformed."""


class ModelError(ZrtError):
    """A model cannot be found, parsed or built."""


class LayoutError(ZrtError):
    """A parallel layout does not divide the model or the machine."""


class UnknownNameError(ZrtError):
    """A name (hardware id, model, backend, ...) is not registered."""


class InternalError(ZrtError):
    """zrt (or a plugin) produced something it cannot stand behind: a decode graph without a
    KV cache, captured FLOPs far from the analytic count, a throughput of zero or not finite.
    A bug, not bad input: exit status 1, and the message names the cause."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message, hint or "this is a bug in zrt or a plugin; please report it "
                         "with the command that showed it")
