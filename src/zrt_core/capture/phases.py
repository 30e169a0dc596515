"""Run the phases on a fake model: prefill, decode with prefill's cache, forward+backward.

- ``prefill``: ``B × S`` tokens, no grad, a fresh cache; logits for the last position only
  (``logits_to_keep=1``, what serving engines compute) unless asked otherwise.
- ``decode``: one new token per sequence, passing the cache prefill produced
  (``DynamicCache`` or the family's own hybrid cache) under the keyword the installed
  transformers takes (``cache`` from 5.24, ``past_key_values`` before). When prefill is not
  requested it still runs, unrecorded, to produce the cache. A decode step that leaves the
  cache as long as it found it ran without it: an :class:`InternalError`, never a graph.
- ``train_forward`` / ``train_backward``: one forward with ``labels`` (the loss included)
  and ``loss.backward()``, recorded as two phases of one run so saved activations keep
  their tensor ids across the two graphs.
"""

from __future__ import annotations

import inspect
import time
from typing import Any

from zrt_core.capture.compat import cache_keyword, output_cache
from zrt_core.capture.options import CaptureOptions
from zrt_core.capture.recorder import CaptureSession, ModuleStack, OpRecorder
from zrt_core.errors import InternalError, ModelError
from zrt_core.ir.graph import Phase


class PhaseRunner:
    """Runs the requested phases of one fake model into one :class:`CaptureSession`."""

    #: what records a phase (graph mode swaps in its own, see capture.graphmode)
    recorder_class: Any = OpRecorder

    def __init__(self, model: Any, session: CaptureSession, modules: ModuleStack,
                 options: CaptureOptions, model_name: str) -> None:
        self.model = model
        self.session = session
        self.modules = modules
        self.options = options
        self.model_name = model_name
        self.timings_s: dict[str, float] = {}
        self.kv_len: int | None = None
        params = inspect.signature(model.forward).parameters
        self._logits_to_keep = "logits_to_keep" in params
        self.notes: list[str] = []
        if options.last_token_logits and not self._logits_to_keep:
            self.notes.append(f"{type(model).__name__} has no logits_to_keep: prefill "
                              "computes logits for every position")

    def run(self) -> None:
        opts = self.options
        if opts.wants_inference:
            cache = self._prefill(record=Phase.PREFILL in opts.phases)
            if Phase.DECODE in opts.phases:
                self._decode(cache)
        if opts.wants_training:
            self._train()

    def _ids(self, length: int) -> Any:
        import torch

        return torch.zeros((self.options.batch, length), dtype=torch.long)

    def _inference_kwargs(self) -> dict[str, Any]:
        if self.options.last_token_logits and self._logits_to_keep:
            return {"logits_to_keep": 1}
        return {}

    def _call(self, phase: str, **kwargs: Any) -> Any:
        try:
            return self.model(**kwargs)
        except ModelError:
            raise
        except Exception as exc:
            raise _capture_error(self.model_name, phase, exc) from exc

    def _prefill(self, *, record: bool) -> Any:
        import torch

        self.model.eval()
        ids = self._ids(self.options.seq_len)
        start = time.perf_counter()
        with torch.no_grad():
            if record:
                with self.recorder_class(self.session, Phase.PREFILL, self.modules):
                    out = self._call(Phase.PREFILL, input_ids=ids, use_cache=True,
                                     **self._inference_kwargs())
            else:
                out = self._call(Phase.PREFILL, input_ids=ids, use_cache=True,
                                 **self._inference_kwargs())
        key = Phase.PREFILL if record else "prefill_for_decode"
        self.timings_s[key] = time.perf_counter() - start
        cache = output_cache(out)
        if cache is None:
            raise ModelError(f"{self.model_name}: prefill returned no KV cache, so decode "
                             "cannot be captured", "capture prefill and training only")
        if _cache_length(cache, -1) == 0:
            # prefill of seq_len tokens stored none: an attention forward did not see the cache
            raise InternalError(
                f"{self.model_name}: prefill wrote nothing into its KV cache, so decode would "
                f"run without one; transformers {_transformers_version()} may pass the cache "
                "under a name a patch does not read")
        return cache

    def _decode(self, cache: Any) -> None:
        import torch

        self.kv_len = _cache_length(cache, self.options.seq_len)
        ids = self._ids(1)
        start = time.perf_counter()
        kwargs = {cache_keyword(self.model): cache}
        with torch.no_grad(), self.recorder_class(self.session, Phase.DECODE, self.modules):
            self._call(Phase.DECODE, input_ids=ids, use_cache=True, **kwargs,
                       **self._inference_kwargs())
        self.timings_s[Phase.DECODE] = time.perf_counter() - start
        after = _cache_length(cache, -1)
        if after >= 0 and after == self.kv_len and self.kv_len > 0:
            # the decode step appended nothing: some attention forward (a patch, most likely)
            # did not see the cache it was handed and attended to the new token alone
            raise InternalError(
                f"{self.model_name}: decode ran without its KV cache (cache length stayed "
                f"{self.kv_len} after a decode step), so its graph would price a model that "
                f"re-reads nothing; transformers {_transformers_version()} may pass the cache "
                "under a name a patch does not read")

    def _train(self) -> None:
        self.model.train()
        ids = self._ids(self.options.seq_len)
        start = time.perf_counter()
        recorder = self.recorder_class(self.session, Phase.TRAIN_FORWARD, self.modules)
        with recorder:
            out = self._call(Phase.TRAIN_FORWARD, input_ids=ids, labels=ids, use_cache=False)
            loss = getattr(out, "loss", None)
            if loss is None:
                raise ModelError(f"{self.model_name}: the model returned no loss for labels",
                                 "capture inference phases only")
            middle = time.perf_counter()
            self.timings_s[Phase.TRAIN_FORWARD] = middle - start
            recorder.phase = Phase.TRAIN_BACKWARD
            try:
                loss.backward()
            except Exception as exc:
                raise _capture_error(self.model_name, Phase.TRAIN_BACKWARD, exc) from exc
        self.timings_s[Phase.TRAIN_BACKWARD] = time.perf_counter() - middle
        self.model.eval()


def _transformers_version() -> str:
    import transformers

    return str(transformers.__version__)


def _cache_length(cache: Any, default: int) -> int:
    """Tokens the cache holds: the longest of its layers' (a hybrid's first layer may keep a
    recurrent state instead — MiniMax's lightning layers report 0, Qwen3-Next's raise)."""
    layers = getattr(cache, "layers", None)
    count = len(layers) if isinstance(layers, list | tuple) else 0
    best: int | None = None
    for i in range(max(count, 1)):
        try:
            length = int(cache.get_seq_length(i) if count else cache.get_seq_length())
        except Exception:
            continue
        best = length if best is None else max(best, length)
    return default if best is None else best


def _capture_error(model: str, phase: str, exc: BaseException) -> ModelError:
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    if len(text) > 240:
        text = text[:237] + "..."
    return ModelError(f"{model}: {phase} failed in the model code: {type(exc).__name__}: {text}",
                      "set ZRT_DEBUG=1 for the traceback; report it if the config is valid")
