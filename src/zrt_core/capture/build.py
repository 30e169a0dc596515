"""Build a transformers model from its config on fake tensors: no weights, no init, no memory.

The model's tensors are fake tensors on the CPU fake device (fake CUDA aborts in backward
on a CPU-only torch), built without weight initialisation: DeepSeek-V3 at full depth
builds in well under 0.1 s once its modeling module is imported. Remote code is never run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attrs import frozen

from zrt_core.errors import ModelError
from zrt_core.modelmath.arch import TEXT_EQUIVALENT_FAMILIES

DTYPES = ("bfloat16", "float16", "float32")


@frozen
class ParamCounts:
    """Parameter counts of the full model (every layer), from the fake parameters.

    ``active`` counts what one token uses: routed experts count ``top_k / num_experts`` of
    their weights; everything else (attention, shared experts, embedding, head) in full.
    ``routed_experts`` is the total size of the routed expert weights.
    """

    total: int
    active: int
    routed_experts: int = 0


#: Keys a text model of ``modelmath.arch.TEXT_EQUIVALENT_FAMILIES`` spells otherwise than
#: the causal-LM family it is built as.
_TEXT_EQUIVALENT_KEYS: dict[str, dict[str, str]] = {
    "qwen3_vl_moe_text": {"num_local_experts": "num_experts"},
}


def _text_equivalent(inner: Any) -> Any:
    """``inner`` (a text config of ``TEXT_EQUIVALENT_FAMILIES``) as its causal-LM family."""
    from transformers import AutoConfig

    family = TEXT_EQUIVALENT_FAMILIES[inner.model_type]
    renamed = _TEXT_EQUIVALENT_KEYS.get(inner.model_type, {})
    fields = {renamed.get(k, k): v for k, v in inner.to_dict().items()
              if k not in ("model_type", "transformers_version", "architectures")
              and not k.startswith("_")}
    rope = fields.get("rope_parameters")
    if isinstance(rope, dict):  # mrope's per-axis sections have no meaning for text alone
        fields["rope_parameters"] = {k: v for k, v in rope.items()
                                     if k not in ("mrope_section", "mrope_interleaved")}
    return AutoConfig.for_model(family, **fields)


def text_config_of(config: Any) -> tuple[Any, str | None]:
    """The language-model config of a (possibly multimodal) config, and a note if it differs.

    For ``gemma3``/``llama4``/``mistral3``-style configs with a ``text_config`` whose type
    has a causal-LM class, the language model is what zrt captures.
    """
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    inner = getattr(config, "text_config", None)
    if inner is None or inner is config:
        return config, None
    outer_type = getattr(config, "model_type", "")
    inner_type = getattr(inner, "model_type", "")
    if inner_type in TEXT_EQUIVALENT_FAMILIES:
        return _text_equivalent(inner), (
            f"{outer_type}: capturing the language model as "
            f"{TEXT_EQUIVALENT_FAMILIES[inner_type]} "
            f"({inner_type}'s text layers compute the same; its multimodal RoPE sections "
            "and the visual features it adds to early layers are left out); the vision "
            "tower is not part of the graph")
    outer_cls = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(outer_type, "")
    if inner_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and (
            not outer_cls or "ConditionalGeneration" in outer_cls or outer_type != inner_type):
        return inner, (f"{outer_type}: capturing the language model ({inner_type}); "
                       "the vision/audio towers are not part of the graph")
    return config, None


def torch_dtype(name: str) -> Any:
    import torch

    if name not in DTYPES:
        raise ModelError(f"unsupported dtype {name!r}", f"use one of {', '.join(DTYPES)}")
    return getattr(torch, name)


def build_fake_model(config: Any, dtype: str, fake_mode: Any, *,
                     model_class: Any = None) -> Any:
    """Instantiate ``AutoModelForCausalLM`` (or ``model_class``, a plugin's causal LM for a
    type transformers lacks) for ``config`` with fake CPU tensors.

    The model is built on the ``meta`` device (no dispatch per parameter: about 7x faster
    than building inside ``FakeTensorMode``) and its parameters, buffers and tensor
    attributes are then wrapped as fake CPU tensors of ``fake_mode``, tied weights kept
    tied. A model whose construction needs real values falls back to building inside
    ``fake_mode``.

    :raises ModelError: the model type has no causal-LM class, or transformers rejects the
        config while building (one line).
    """
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = getattr(config, "model_type", "")
    if model_class is None and model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelError(f"model_type {model_type!r} has no causal language model in "
                         "transformers", "zrt captures decoder LMs (AutoModelForCausalLM)")
    torch_type = torch_dtype(dtype)

    def construct() -> Any:
        if model_class is not None:
            model = model_class._from_config(config, dtype=torch_type)
        else:
            model = AutoModelForCausalLM.from_config(config, dtype=torch_type,
                                                     trust_remote_code=False)
        # no_init_weights skips init_weights, which is also where transformers ties the
        # head to the embedding (tie_word_embeddings): tie here, as loading would
        model.tie_weights()
        return model

    try:
        try:
            with no_init_weights(), torch.device("meta"):
                model = construct()
            return _to_fake(model, fake_mode)
        except (RuntimeError, NotImplementedError, TypeError, ValueError):
            with fake_mode, no_init_weights(), torch.device("cpu"):
                return construct()
    except ModelError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError, IndexError, AssertionError,
            RuntimeError, NotImplementedError) as exc:
        raise ModelError(f"transformers cannot build {model_type!r} from this config: "
                         f"{type(exc).__name__}: {_one_line(exc)}",
                         "check the config fields against the model's config class") from None


def _to_fake(model: Any, fake_mode: Any) -> Any:
    """Swap every meta tensor the model holds for a fake CPU tensor of ``fake_mode``."""
    import torch

    converter = fake_mode.fake_tensor_converter
    cpu = torch.device("cpu")
    done: dict[int, Any] = {}

    def fake(t: Any, *, param: bool) -> Any:
        out = done.get(id(t))
        if out is None:
            if not t.is_meta:
                raise RuntimeError("model holds a tensor that is not on the meta device")
            out = converter.from_meta_and_device(fake_mode, t, cpu)
            if param:
                # what nn.Parameter does for a tensor subclass, without a dispatch
                out.requires_grad_(t.requires_grad)
                out._is_param = True
            done[id(t)] = out
        return out

    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                module._parameters[name] = fake(p, param=True)
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = fake(b, param=False)
        for name, value in list(vars(module).items()):
            if isinstance(value, torch.Tensor) and not name.startswith("_"):
                object.__setattr__(module, name, fake(value, param=False))
    return model


def _one_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def is_routed_experts(module: Any, num_experts: int) -> bool:
    """A module holding all routed experts as stacked 3-D weights (transformers 5 style)."""
    if num_experts <= 1:
        return False
    params = list(module.parameters(recurse=False))
    return bool(params) and any(p.dim() == 3 and p.shape[0] == num_experts for p in params)


def count_params(model: Any, num_experts: int, top_k: int) -> ParamCounts:
    """Total and per-token active parameters of the full fake model."""
    total = sum(p.numel() for p in model.parameters())
    routed = 0
    if num_experts > 1 and top_k > 0:
        for module in model.modules():
            if is_routed_experts(module, num_experts):
                routed += sum(p.numel() for p in module.parameters(recurse=False)
                              if p.shape and p.shape[0] == num_experts)
    inactive = routed - routed * top_k // num_experts if num_experts > 1 else 0
    return ParamCounts(total=total, active=total - inactive, routed_experts=routed)


def config_value(config: Any, *names: str, default: Any = None) -> Any:
    for n in names:
        v = getattr(config, n, None)
        if v is not None:
            return v
    return default


def config_mapping(config: Any) -> Mapping[str, Any]:
    return config.to_dict() if hasattr(config, "to_dict") else dict(config)
