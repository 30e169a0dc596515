"""Transforms: ordered passes over an :class:`OpGraph`, each a small object with a name.

A transform never mutates its input; it returns a new graph (``graph.with_nodes(...)`` or
``attrs.evolve``). :func:`apply_all` runs a sequence and records their names in
``graph.meta["transforms"]`` so every report can say what was applied.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from attrs import evolve, frozen

if TYPE_CHECKING:
    from zrt_core.hardware import HardwareSpec
    from zrt_core.ir.graph import OpGraph
    from zrt_core.modelinfo import ModelDims
    from zrt_core.plugins import PluginHost
    from zrt_core.strategy import InferSpec, Parallel, TrainSpec


@frozen
class TransformContext:
    """What a transform may read: the model, the machine, the layout and the workload."""

    dims: ModelDims
    hardware: HardwareSpec
    parallel: Parallel
    host: PluginHost
    train: TrainSpec | None = None
    infer: InferSpec | None = None

    @property
    def platform(self) -> str:
        """The fusion/kernel platform of the hardware: ``cuda``, ``ascend`` or ``generic``."""
        return {"nvidia": "cuda", "huawei": "ascend", "ascend": "ascend"}.get(
            self.hardware.vendor.lower(), "generic")

    @property
    def training(self) -> bool:
        return self.train is not None


class Transform(Protocol):
    name: str

    def apply(self, graph: OpGraph, ctx: TransformContext) -> OpGraph: ...


def apply_all(graph: OpGraph, transforms: Iterable[Transform], ctx: TransformContext
              ) -> OpGraph:
    """Run transforms in order, appending each name to ``meta["transforms"]``."""
    for t in transforms:
        graph = t.apply(graph, ctx)
        applied = (*graph.meta.get("transforms", ()), t.name)
        graph = evolve(graph, meta={**graph.meta, "transforms": applied})
    return graph
