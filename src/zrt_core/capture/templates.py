"""Layer templates: find the kinds of decoder layers and capture one layer of each kind.

A kind is a structural signature: the classes of a layer's modules, its parameter shapes and
dtypes, and the scalar attributes that change what it computes (``attention_type``,
``sliding_window``, ``is_sliding``, ``block_type``, ``use_rope``...), plus the config's
``layer_types`` entry. Index-like attributes (``layer_idx``) are left out. Layers with equal
signatures run the same operators on the same shapes, so one of them is captured and the
others are stood in for by :class:`SkippedLayer`, which passes its input through. The model
loop still runs once per layer, so whatever the model does between layers is recorded as
often as in a full capture; the representative is the first layer of its kind and keeps its
own ``layer_idx``, so caches index correctly.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from attrs import frozen

from zrt_core.capture.build import is_routed_experts

_INDEX_ATTR = re.compile(r"(^|_)(layer_?idx|layer_?id|layer_?number|layer_?index|idx|index)$")
_SCALARS = (bool, int, float, str, type(None))
# config mlp_layer_types spellings → kind names (DeepSeek V3.2 says "sparse" for MoE)
_MLP_TYPE_NAMES = {"sparse": "moe"}
_FFN_CLASS = re.compile(r"(MLP|Mlp|FeedForward|FFN|Ffn)")
_MOE_CLASS = re.compile(r"(Experts$|SparseMoe|MoeBlock|MoEBlock|MoELayer|MoeLayer|Moe$|MoE$)")


@frozen
class LayerKind:
    """Layers that share one signature: ``kind`` name and every index, representative first."""

    kind: str
    indices: tuple[int, ...]

    @property
    def representative(self) -> int:
        return self.indices[0]


def find_layer_list(model: Any, num_layers: int) -> tuple[str, Any]:
    """The ``ModuleList`` of decoder layers and its path (``"model.layers"``).

    The longest module list whose length is the config's layer count; ties prefer the
    usual names (``layers``, ``h``, ``blocks``).
    """
    import torch.nn as nn

    best: tuple[int, str, Any] | None = None
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) != num_layers:
            continue
        leaf = name.rsplit(".", 1)[-1]
        score = {"layers": 3, "h": 3, "blocks": 2, "layer": 1}.get(leaf, 0)
        if best is None or score > best[0]:
            best = (score, name, module)
    if best is None:
        return "", None
    return best[1], best[2]


def _scalar_attrs(module: Any) -> tuple[tuple[str, Any], ...]:
    out = []
    for key, value in vars(module).items():
        if key.startswith("_") or _INDEX_ATTR.search(key) or key == "training":
            continue
        if isinstance(value, _SCALARS):
            out.append((key, value))
        elif isinstance(value, tuple | list) and all(isinstance(v, _SCALARS) for v in value):
            out.append((key, tuple(value)))
    return tuple(sorted(out))


def layer_signature(layer: Any, layer_type: Any = None) -> tuple:
    """A hashable description of everything about a layer that shapes its operators."""
    parts: list[Any] = [("layer_type", str(layer_type))]
    for rel, module in layer.named_modules():
        params = tuple((n, tuple(p.shape), str(p.dtype))
                       for n, p in module.named_parameters(recurse=False))
        buffers = tuple((n, tuple(b.shape), str(b.dtype))
                        for n, b in module.named_buffers(recurse=False) if b is not None)
        parts.append((rel, type(module).__name__, params, buffers, _scalar_attrs(module)))
    return tuple(parts)


def _attention_part(layer: Any, layer_type: Any) -> str | None:
    """The mixer kind: ``mamba`` for a Mamba mixer, the layer's own ``block_type``
    (Nemotron-H), else the config's ``layer_types`` entry."""
    if any("Mamba" in type(m).__name__ for m in layer.modules()):
        return "mamba"  # transformers 5 calls Nemotron-H's Mamba blocks linear_attention
    block = getattr(layer, "block_type", None)
    if isinstance(block, str):
        return block
    if isinstance(layer_type, str):
        return layer_type
    for attr in ("attention_type", "layer_type"):
        v = getattr(layer, attr, None)
        if isinstance(v, str):
            return v
    return None


def _ffn_part(layer: Any, num_experts: int) -> str | None:
    has_ffn = False
    for module in layer.modules():
        name = type(module).__name__
        if is_routed_experts(module, num_experts) or _MOE_CLASS.search(name):
            return "moe"
        if _FFN_CLASS.search(name):
            has_ffn = True
    return "dense" if has_ffn else None


def group_layers(layers: Sequence[Any], layer_types: Sequence[Any] | None,
                 num_experts: int, mlp_layer_types: Sequence[Any] | None = None
                 ) -> list[LayerKind]:
    """Kinds of decoder layers in order of first appearance, with readable names.

    Names come from the config's ``layer_types`` or the layer's ``block_type`` /
    ``attention_type`` (when those vary across layers) and from the FFN (the config's
    ``mlp_layer_types`` entry, else ``dense`` / ``moe``, when that varies): ``"dense"``,
    ``"moe"``, ``"sliding_attention"``, ``"mamba"``, ``"full_attention+moe"``. Two
    signatures with one name get ``_2``, ``_3``.
    """
    signatures: dict[tuple, list[int]] = {}
    info: dict[tuple, tuple[str | None, str | None]] = {}
    for i, layer in enumerate(layers):
        lt = layer_types[i] if layer_types is not None and i < len(layer_types) else None
        mlp_type = (mlp_layer_types[i] if mlp_layer_types is not None
                    and i < len(mlp_layer_types) else None)
        sig = (layer_signature(layer, lt), str(mlp_type))
        signatures.setdefault(sig, []).append(i)
        if sig not in info:
            ffn = (_MLP_TYPE_NAMES.get(mlp_type, mlp_type) if isinstance(mlp_type, str)
                   else _ffn_part(layer, num_experts))
            info[sig] = (_attention_part(layer, lt), ffn)
    att_vary = len({a for a, _ in info.values()}) > 1
    ffn_vary = len({f for _, f in info.values()}) > 1
    kinds: list[LayerKind] = []
    used: dict[str, int] = {}
    for sig, indices in signatures.items():
        att, ffn = info[sig]
        if len(signatures) == 1:
            name = ffn or "dense"
        else:
            parts = []
            if att_vary and att:
                parts.append(att)
            if ffn_vary and ffn and ffn not in parts and att not in ("mlp", "moe"):
                parts.append(ffn)
            name = "+".join(parts) or "layer"
        used[name] = used.get(name, 0) + 1
        if used[name] > 1:
            name = f"{name}_{used[name]}"
        kinds.append(LayerKind(kind=name, indices=tuple(indices)))
    return kinds


def make_skipped_layer(original: Any, returns: dict[str, Any]) -> Any:
    """A stand-in for a layer whose kind is captured elsewhere: returns its hidden states.

    It carries the original's scalar attributes (``attention_type``, ``block_type``...)
    that model loops read, and returns what the representative layers return (a tensor,
    or a tuple whose first element is the hidden states), learnt from ``returns``.
    """
    import torch.nn as nn

    class SkippedLayer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for key, value in vars(original).items():
                if not key.startswith("_") and isinstance(value, _SCALARS):
                    setattr(self, key, value)
            self.skipped_class = type(original).__name__

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            hidden = args[0] if args else kwargs.get("hidden_states")
            if returns.get("tuple"):
                return (hidden, *([None] * (returns["tuple"] - 1)))
            return hidden

    return SkippedLayer()


def install_templates(layer_list: Any, kinds: Sequence[LayerKind]) -> list[Any]:
    """Replace every non-representative layer by a :class:`SkippedLayer`, in place.

    :return: forward-hook handles on the representatives (remove them after capture).
    """
    returns: dict[str, Any] = {}

    def learn(_module: Any, _args: Any, output: Any) -> None:
        if isinstance(output, tuple):
            returns["tuple"] = len(output)

    handles = []
    for kind in kinds:
        handles.append(layer_list[kind.representative].register_forward_hook(learn))
        for i in kind.indices[1:]:
            layer_list[i] = make_skipped_layer(layer_list[i], returns)
    return handles
