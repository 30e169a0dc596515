"""What one capture run is asked to do; model patches receive it."""

from __future__ import annotations

from attrs import field, frozen

from zrt_core.errors import ModelError
from zrt_core.ir.graph import Phase


def _positive(name: str):
    def check(_inst, _attr, value) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ModelError(f"{name} must be a positive integer, got {value!r}",
                             f"pass {name}=1 or more")
    return check


def _phases(value) -> tuple[str, ...]:
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, list | tuple | set | frozenset):
        raise ModelError(f"phases must be a phase name or a list of them, got {value!r}",
                         f"capture phases are {', '.join(Phase.CAPTURED)}")
    out = []
    for p in value:
        if not isinstance(p, str) or p not in Phase.CAPTURED:
            raise ModelError(f"unknown phase {p!r}",
                             f"capture phases are {', '.join(Phase.CAPTURED)}")
        if p not in out:
            out.append(p)
    if not out:
        raise ModelError("no phase to capture", f"pick from {', '.join(Phase.CAPTURED)}")
    return tuple(out)


def _imbalance(_inst, _attr, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 1.0:
        raise ModelError(f"moe_imbalance must be a number >= 1.0, got {value!r}",
                         "1.0 is balanced routing; 2.0 gives the busiest expert twice "
                         "the mean load")


@frozen
class CaptureOptions:
    """Options of one capture run.

    :param phases: which of ``prefill``, ``decode``, ``train_forward``, ``train_backward``.
    :param batch: sequences per step (B).
    :param seq_len: prompt / training sequence length (S); decode attends to a cache of
        ``seq_len`` tokens plus the new one.
    :param full_depth: capture every decoder layer instead of one per kind.
    :param moe_imbalance: load of the busiest expert over the mean (1.0: balanced).
    :param dtype: parameter and activation dtype (``bfloat16``, ``float16``, ``float32``).
    :param last_token_logits: prefill and decode compute logits for the last position only
        (what serving engines do); training always computes them for every position.
    :param graph_mode: capture through ``torch.compile`` (AOTAutograd's aten graphs)
        instead of eager dispatch.
    """

    phases: tuple[str, ...] = field(default=Phase.CAPTURED, converter=_phases)
    batch: int = field(default=1, validator=_positive("batch"))
    seq_len: int = field(default=2048, validator=_positive("seq_len"))
    full_depth: bool = False
    moe_imbalance: float = field(default=1.0, validator=_imbalance)
    dtype: str = "bfloat16"
    last_token_logits: bool = True
    graph_mode: bool = False

    @property
    def wants_training(self) -> bool:
        return Phase.TRAIN_FORWARD in self.phases or Phase.TRAIN_BACKWARD in self.phases

    @property
    def wants_inference(self) -> bool:
        return Phase.PREFILL in self.phases or Phase.DECODE in self.phases
