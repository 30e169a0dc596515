"""``zrt measure``: run the real transformers model (random weights) on a device and time it
at three levels — whole step, each decoder layer and its sub-modules (hooks), and each
kernel (``torch.profiler``) — optionally under ``torch.compile`` with a numerics check.

Timing is on the step the prediction prices: a training step's forward and backward (no
optimizer), a prefill of ``seq_len`` tokens, or one decode step attending to a cache of
``seq_len`` tokens (the cache is cut back to ``seq_len`` after every step). The layer and
sub-module timers add a few microseconds per hook, so the end-to-end time comes from runs
without hooks, and the kernel times from a run of their own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from attrs import frozen

from zrt_core.errors import ModelError, ZrtError
from zrt_core.profile.device import Device, cpu_clock, synchronize

SCHEMA = "zrt-measure/1"
MODES = ("train", "prefill", "decode")
#: kernel (profiler) names that are not aten ops a graph holds: wrappers of the real work
_WRAPPERS = ("aten::linear", "aten::scaled_dot_product_attention", "aten::matmul",
             "aten::dropout", "aten::softmax", "aten::log_softmax", "aten::cross_entropy_loss",
             "aten::nll_loss_nd", "aten::to", "aten::type_as", "aten::contiguous",
             "aten::reshape", "aten::flatten", "aten::repeat_interleave")


@frozen
class MeasureRequest:
    """What to run.

    :param model: a bundled name, config.json path or mapping (as ``zrt run``).
    :param mode: ``train`` (forward + backward), ``prefill`` or ``decode``.
    :param layers: keep the first N decoder layers (None: all).
    """

    model: Any
    mode: str
    batch: int
    seq_len: int
    layers: int | None = None
    dtype: str = "float32"
    repeats: int = 5
    warmup: int = 2
    compile: bool = False
    seed: int = 0


def measure(request: MeasureRequest, device: Device, host: Any = None) -> dict[str, Any]:
    """Run ``request`` on ``device``; the measurement as a JSON-ready mapping (``SCHEMA``).

    :raises ModelError: the model cannot be resolved or built.
    """
    import torch

    if request.mode not in MODES:
        raise ZrtError(f"unknown mode {request.mode!r}", f"use one of {', '.join(MODES)}")
    torch.manual_seed(request.seed)
    name, config_map, model = build_model(request, device, host)
    layers = _decoder_layers(model, config_map)
    torch.manual_seed(request.seed + 1)
    step, prepare, outputs = step_calls(model, request, device, config_map)
    eager_out = None
    if request.compile:
        prepare()
        with torch.no_grad():
            eager_out = outputs()
        model.forward = torch.compile(model.forward)
        torch.manual_seed(request.seed + 1)  # the same inputs as the eager step's
        step, prepare, outputs = step_calls(model, request, device, config_map)

    samples = _time_steps(step, prepare, device, request.warmup, request.repeats)
    timeline, per_layer, per_module = _time_layers(model, layers, step, prepare, device,
                                                   request.repeats, request.mode == "train")
    kernels = _profile_kernels(step, prepare, device, request.repeats)
    numerics = None
    if request.compile:
        prepare()
        with torch.no_grad():
            compiled_out = outputs()
        diff = float((compiled_out - eager_out).abs().max())
        numerics = {"allclose": bool(torch.allclose(compiled_out, eager_out, rtol=1e-3,
                                                    atol=1e-4)),
                    "max_abs_diff": diff, "rtol": 1e-3, "atol": 1e-4}
    step_s = min(samples)
    layer_sum = sum(r["total_s"] for r in per_layer)
    return {
        "schema": SCHEMA,
        "model": name,
        "config": config_map,
        "device": device.to_json(),
        "mode": request.mode,
        "batch": request.batch,
        "seq_len": request.seq_len,
        "dtype": request.dtype,
        "num_layers": len(layers),
        "compile": request.compile,
        "repeats": request.repeats,
        "step_s": step_s,
        "step_samples_s": samples,
        "layers": per_layer,
        "outside_layers_s": max(0.0, step_s - layer_sum),
        "modules": per_module,
        "kernels": kernels,
        "timeline": timeline,
        "numerics": numerics,
    }


def build_model(request: MeasureRequest, device: Device, host: Any
                ) -> tuple[str, dict[str, Any], Any]:
    """(name, config mapping, the transformers model with random weights on ``device``) for
    ``request`` (its first ``layers`` decoder layers when given).

    :raises ModelError: transformers cannot build the config.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from zrt_core.capture.sources import resolve_model, transformers_config

    if host is None:
        from zrt_core.plugins import get_plugin_manager

        host = get_plugin_manager()
    resolved = resolve_model(request.model, host)
    config_map = dict(resolved.config)
    if request.layers is not None:
        key = "n_layer" if "n_layer" in config_map else "num_hidden_layers"
        total = config_map.get(key)
        if isinstance(total, int) and request.layers > total:
            raise ZrtError(f"--layers {request.layers} is more than the model's {total}")
        config_map[key] = request.layers
        for list_key in ("layer_types", "mlp_layer_types"):
            if isinstance(config_map.get(list_key), list):
                config_map[list_key] = config_map[list_key][:request.layers]
    config = transformers_config(config_map, where=resolved.name, host=host)
    torch_type = getattr(torch, request.dtype, None)
    if not isinstance(torch_type, torch.dtype):
        raise ZrtError(f"unknown dtype {request.dtype!r}", "use float32, bfloat16 or float16")
    if device.kind == "cpu" and request.dtype not in ("float32", "bfloat16", "float16"):
        raise ZrtError(f"device cpu has no {request.dtype} models",
                       "use float32, bfloat16 or float16")
    try:
        with torch.device(device.torch_device):
            model = AutoModelForCausalLM.from_config(config, dtype=torch_type,
                                                     trust_remote_code=False)
    except (ValueError, TypeError, KeyError, AttributeError, RuntimeError) as exc:
        raise ModelError(f"transformers cannot build {resolved.name!r}: "
                         f"{type(exc).__name__}: {' '.join(str(exc).split())}") from None
    model.train(request.mode == "train")
    return resolved.name, config_map, model


def _decoder_layers(model: Any, config_map: Mapping[str, Any]) -> list[Any]:
    """The decoder layers: the longest ModuleList named ``layers`` or ``h``."""
    import torch

    found = [m for n, m in model.named_modules()
             if isinstance(m, torch.nn.ModuleList) and n.rsplit(".", 1)[-1] in ("layers", "h")]
    if not found:
        raise ModelError("no decoder layers (a ModuleList named layers or h) in the model",
                         "zrt measure times decoder LMs built by AutoModelForCausalLM")
    return list(max(found, key=len))


def step_calls(model: Any, request: MeasureRequest, device: Device,
               config_map: Mapping[str, Any]) -> tuple[Callable[[], Any], Callable[[], None],
                                                       Callable[[], Any]]:
    """(one timed step, its untimed preparation, the step's logits for a numerics check)."""
    import torch

    vocab = int(model.config.vocab_size)
    dev = device.torch_device
    b, s = request.batch, request.seq_len
    ids = torch.randint(0, vocab, (b, s), device=dev)
    if request.mode == "train":
        def prepare() -> None:
            for p in model.parameters():
                p.grad = None

        def step() -> Any:
            model(input_ids=ids, labels=ids).loss.backward()

        return step, prepare, lambda: model(input_ids=ids).logits
    if request.mode == "prefill":
        def step() -> Any:
            with torch.no_grad():
                return model(input_ids=ids, logits_to_keep=1)

        return step, lambda: None, lambda: model(input_ids=ids, logits_to_keep=1).logits
    from zrt_core.capture.compat import cache_keyword, output_cache

    with torch.no_grad():
        cache = output_cache(model(input_ids=ids, use_cache=True))
    keyword = cache_keyword(model)  # "cache" from transformers 5.24, else past_key_values
    new = torch.randint(0, vocab, (b, 1), device=dev)
    position = torch.full((b, 1), s, device=dev, dtype=torch.long)

    def prepare_decode() -> None:
        extra = cache.get_seq_length() - s
        if extra > 0:  # transformers 5 crops by a negative count of tokens to drop
            cache.crop(-extra)
        steady_cache(cache)

    def decode() -> Any:
        with torch.no_grad():
            return model(input_ids=new, position_ids=position, logits_to_keep=1,
                         use_cache=True, **{keyword: cache})

    def logits() -> Any:
        prepare_decode()
        return decode().logits

    return decode, prepare_decode, logits


def steady_cache(cache: Any) -> None:
    """Make each layer's key and value tensors of a transformers cache contiguous, as a
    generation loop's cache is after its first step (each step's ``torch.cat`` writes a
    new, contiguous one). A cropped cache is a strided view, and the prefill's keys come
    from a transpose: a ``cat`` of strided inputs runs CUDA's slow ``CatArrayBatchedCopy``
    instead of the contiguous kernel (TensorRT-LLM PR #8044's profile), so every timed
    decode step would pay a cost a real loop pays once. A cache without ``layers`` (before
    transformers 4.56) keeps its lists ``key_cache`` / ``value_cache``."""
    import torch

    layers = getattr(cache, "layers", None)
    if layers:
        for layer in layers:
            for name in ("keys", "values"):
                t = getattr(layer, name, None)
                if isinstance(t, torch.Tensor) and not t.is_contiguous():
                    setattr(layer, name, t.contiguous())
        return
    for name in ("key_cache", "value_cache"):
        tensors = getattr(cache, name, None)
        if isinstance(tensors, list):
            tensors[:] = [t.contiguous() if isinstance(t, torch.Tensor) else t
                          for t in tensors]


def _time_steps(step: Callable[[], Any], prepare: Callable[[], None], device: Device,
                warmup: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        prepare()
        step()
    clock = _Clock(device)
    samples = []
    for _ in range(repeats):
        prepare()
        synchronize(device)
        t0 = clock.mark()
        step()
        t1 = clock.mark()
        synchronize(device)
        if clock.cuda:
            t1.synchronize()
        samples.append(clock.seconds(t0, t1))
    return sorted(samples)


class _Clock:
    """Marks on the device's clock: CUDA events on a GPU, :func:`cpu_clock` on a CPU."""

    def __init__(self, device: Device) -> None:
        self.cuda = device.kind == "cuda"
        self.clock = cpu_clock(device)

    def mark(self) -> Any:
        if self.cuda:
            import torch

            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return self.clock()

    def seconds(self, start: Any, end: Any) -> float:
        if self.cuda:
            return start.elapsed_time(end) * 1e-3
        return end - start


def _time_layers(model: Any, layers: list[Any], step: Callable[[], Any],
                 prepare: Callable[[], None], device: Device, repeats: int, backward: bool
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Per layer and per sub-module (each layer's direct children) forward and backward
    times, the best of ``repeats`` steps; and the timeline of the best step.

    Forward: a pre-hook and a hook around the module. Backward: the gradient hook of the
    module's output starts it, the gradient hook of its input (complete once every use of
    the input has its gradient) ends it.
    """
    import torch

    targets: list[tuple[str, int, Any]] = []
    for index, layer in enumerate(layers):
        targets.append(("layer", index, layer))
        for child_name, child in layer.named_children():
            targets.append((child_name, index, child))
    marks: list[tuple[str, int, str, Any]] = []  # (module, layer, "fwd0"/..., mark)
    clock = _Clock(device)
    handles = []

    def first_tensor(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value
        if isinstance(value, (tuple, list)):
            for v in value:
                t = first_tensor(v)
                if t is not None:
                    return t
        if isinstance(value, Mapping):
            for v in value.values():
                t = first_tensor(v)
                if t is not None:
                    return t
        return None

    for name, index, module in targets:
        def pre(_m: Any, args: Any, kwargs: Any, name: str = name, index: int = index) -> None:
            marks.append((name, index, "fwd0", clock.mark()))
            x = first_tensor(args) if args else None
            x = x if x is not None else first_tensor(kwargs)
            if backward and x is not None and x.requires_grad:
                x.register_hook(lambda g, name=name, index=index:
                                marks.append((name, index, "bwd1", clock.mark())))

        def post(_m: Any, _args: Any, _kwargs: Any, output: Any, name: str = name,
                 index: int = index) -> None:
            marks.append((name, index, "fwd1", clock.mark()))
            y = first_tensor(output)
            if backward and y is not None and y.requires_grad:
                y.register_hook(lambda g, name=name, index=index:
                                marks.append((name, index, "bwd0", clock.mark())))

        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post, with_kwargs=True))
    best: dict[tuple[str, int, str], float] = {}
    best_total = float("inf")
    timeline: list[dict[str, Any]] = []
    try:
        for _ in range(repeats):
            marks.clear()
            prepare()
            synchronize(device)
            start = clock.mark()
            step()
            end = clock.mark()
            synchronize(device)
            if clock.cuda:
                end.synchronize()
            spans = _spans(marks, clock)
            for key, seconds in spans.items():
                best[key] = min(best.get(key, float("inf")), seconds)
            total = clock.seconds(start, end)
            if total < best_total:
                best_total = total
                timeline = _timeline(marks, clock, start)
    finally:
        for h in handles:
            h.remove()
    per_layer = []
    for index in range(len(layers)):
        fwd = best.get(("layer", index, "fwd"), 0.0)
        bwd = best.get(("layer", index, "bwd"), 0.0)
        per_layer.append({"index": index, "forward_s": fwd, "backward_s": bwd,
                          "total_s": fwd + bwd})
    modules: dict[str, dict[str, float]] = {}
    for (name, _index, phase), seconds in sorted(best.items()):
        if name == "layer":
            continue
        row = modules.setdefault(name, {"forward_s": 0.0, "backward_s": 0.0})
        row["forward_s" if phase == "fwd" else "backward_s"] += seconds
    per_module = [{"name": n, **r, "total_s": r["forward_s"] + r["backward_s"]}
                  for n, r in modules.items()]
    return timeline, per_layer, per_module


def _spans(marks: list[tuple[str, int, str, Any]], clock: _Clock
           ) -> dict[tuple[str, int, str], float]:
    """Seconds per (module, layer, fwd|bwd): first start to last end (a module called
    twice in a step — a shared norm — is summed)."""
    opened: dict[tuple[str, int, str], Any] = {}
    spans: dict[tuple[str, int, str], float] = {}
    for name, index, what, mark in marks:
        phase, edge = what[:3], what[3]
        key = (name, index, phase)
        if edge == "0":
            opened[key] = mark
        elif key in opened:
            spans[key] = spans.get(key, 0.0) + clock.seconds(opened.pop(key), mark)
    return spans


def _timeline(marks: list[tuple[str, int, str, Any]], clock: _Clock, start: Any
              ) -> list[dict[str, Any]]:
    opened: dict[tuple[str, int, str], Any] = {}
    out = []
    for name, index, what, mark in marks:
        if name != "layer":
            continue
        phase, edge = what[:3], what[3]
        if edge == "0":
            opened[(name, index, phase)] = mark
        elif (name, index, phase) in opened:
            begin = opened.pop((name, index, phase))
            out.append({"name": f"layer {index} {phase}", "layer": index, "phase": phase,
                        "start_s": clock.seconds(start, begin),
                        "dur_s": clock.seconds(begin, mark)})
    return sorted(out, key=lambda e: e["start_s"])


def _profile_kernels(step: Callable[[], Any], prepare: Callable[[], None], device: Device,
                     repeats: int) -> list[dict[str, Any]]:
    """Self time per aten op, from ``torch.profiler`` (device time on a GPU): each step is
    profiled on its own and each op keeps its least total over the steps (a busy machine's
    interruptions land on one op of one step). Wrappers whose work is in the ops they call
    (``aten::linear`` → ``aten::addmm``) keep only their own (self) time, so the sum over
    kernels is the step's op time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.kind == "cuda":
        activities.append(ProfilerActivity.CUDA)
    best: dict[str, dict[str, Any]] = {}
    for _ in range(max(1, repeats)):
        prepare()
        with profile(activities=activities) as prof:
            step()
            synchronize(device)
        for evt in prof.key_averages():
            if not evt.key.startswith("aten::"):
                continue
            self_us = (evt.self_device_time_total if device.kind == "cuda"
                       else evt.self_cpu_time_total)
            row = {"op": evt.key, "calls": int(evt.count), "self_s": float(self_us) * 1e-6,
                   "wrapper": evt.key in _WRAPPERS}
            if evt.key not in best or row["self_s"] < best[evt.key]["self_s"]:
                best[evt.key] = row
    return sorted(best.values(), key=lambda r: -r["self_s"])
