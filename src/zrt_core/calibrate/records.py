"""The fitted parameters of the first-party hardware packs, and the predictor that scores
them on validation records with zrt's own estimators (docs/calibration.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from attrs import evolve

from zrt_core.calibrate.fitting import Fit, Param, Sample
from zrt_core.errors import ZrtError

if TYPE_CHECKING:
    from zrt_core.hardware import HardwareSpec
    from zrt_core.plugins import PluginHost
    from zrt_core.validate import Record

#: Every number of the shipped hardware packs that was fitted to validation records
#: (docs/calibration.md has the inventory, with the values fitted to kernel timings that
#: are not here). ``shipped`` is the pack's value; ``default`` the value without the fit.
#: The GH100 die's packs (H100, H200 and H800: one value for the three) and the
#: ``matmul_sustained`` they ship, which is also its 16-bit fraction's value without records.
_GH100 = ("nvidia_h100_sxm", "nvidia_h200", "nvidia_h800")
_GH100_SUSTAINED = 0.89

PACK_PARAMS: tuple[Param, ...] = (
    # The fraction of its isolated-kernel rate a GEMM keeps inside a whole workload
    # (docs/cost-model.md). Without the fit: 1 (the kernel rate itself). A die without
    # records of its own takes the mean of the dies fitted beside it.
    Param("ga100.matmul_sustained", "matmul_sustained", ("nvidia_a100_sxm_80g",),
          default=1.0, shipped=0.83, lo=0.60, hi=1.00, fallback="field_mean",
          basis="1: the isolated-kernel rate"),
    # H100, H200 and H800 are one die (GH100): one value for the three.
    Param("gh100.matmul_sustained", "matmul_sustained", _GH100,
          default=1.0, shipped=_GH100_SUSTAINED, lo=0.60, hi=1.00, fallback="field_mean",
          basis="1: the isolated-kernel rate"),
    # GH100's 16-bit GEMMs inside a workload, fitted on its bf16 records (docs/calibration.md,
    # "16-bit GEMMs on Hopper"); applied to every bf16/fp16 GEMM on the die. Without records:
    # the die's shipped matmul_sustained (no 16-bit term of its own).
    Param("gh100.matmul_sustained_16bit", "matmul_sustained_16bit", _GH100,
          precisions=("bf16",), default=_GH100_SUSTAINED, shipped=0.75, lo=0.50, hi=1.00, fallback="default",
          basis="the die's shipped matmul_sustained"),
    # Blackwell: the B200 die in DGX B200 (1.0 kW) and GB200 NVL72 (1.2 kW), Blackwell Ultra
    # (160 SMs, the same tensor cores) in DGX B300 (1.1 kW) and GB300 NVL72 (1.4 kW). One
    # fraction for the four: what separates the SKUs in a training step is the clock their
    # board power sustains, compute.power_limited_clock in each pack (docs/cost-model.md,
    # "The power-limited clock"). Searched over every record of the four, MoE included.
    # Without records: the mean of the other dies' values.
    Param("blackwell.matmul_sustained", "matmul_sustained",
          ("nvidia_b200", "nvidia_gb200_nvl72", "nvidia_b300", "nvidia_gb300_nvl72"),
          default=1.0, shipped=0.70, lo=0.50, hi=1.00, fallback="field_mean",
          basis="1: the isolated-kernel rate"),
    # B200's NVFP4 GEMM rate, TensorRT-LLM's end to end (the product with matmul_sustained,
    # 0.63 x 0.70 = 0.44, is what its 10 serving records fix); without records, MAMF's
    # isolated 0.736 over a 0.96 K loop, the value B300 and GB300 ship. GB200 (the same
    # die) ships this value by rule, not by a fit over its records: fitted over B200 and
    # GB200, the one GB200 NVFP4 training record pulls it to 0.34 when the serving records
    # are held out (serving leave-one-source-out 10.0% -> 12.8%; docs/calibration.md).
    Param("b200.matmul_fp4", "matmul_fp4", ("nvidia_b200",), precisions=("nvfp4",),
          default=0.77, shipped=0.63, lo=0.30, hi=0.95, fallback="default",
          basis="MAMF's nvfp4 6624 of 9000 TFLOP/s over a 0.96 K loop"),
)

#: The measured quantity a record of each workload is scored on (the first it has).
QUANTITY = {"train": ("step_time_s",),
            "infer": ("output_tokens_per_s", "output_tokens_per_s_per_gpu")}


def samples_from_records(records: Sequence[Record]) -> list[Sample]:
    """One :class:`Sample` per training record with a measured step time and per serving
    record with a measured output throughput; records that fail the file checks
    (:func:`~zrt_core.validate.check_record`) or measure neither are left out."""
    from zrt_core.validate import check_record

    out: list[Sample] = []
    seen: set[str] = set()
    for record in records:
        try:
            check_record(record, seen)
        except ZrtError:
            continue
        seen.add(record.id)
        measured = record.measured
        quantity = next((q for q in QUANTITY.get(record.workload, ()) if measured.get(q)),
                        None)
        if quantity is None:
            continue
        precision = record.raw.get("precision")
        out.append(Sample(id=record.id, hardware=record.hardware, workload=record.workload,
                          quantity=quantity, measured=measured[quantity],
                          precision=None if precision is None else str(precision).lower(),
                          family=record.model_type))
    return out


class _OverrideHost:
    """The plugin host with some hardware specs replaced (by resolved id); everything else
    is the real host's."""

    def __init__(self, host: PluginHost) -> None:
        self._host = host
        self.overrides: dict[str, HardwareSpec] = {}

    def hardware_spec(self, name: str) -> HardwareSpec:
        spec = self._host.hardware_spec(name)
        return self.overrides.get(spec.id, spec)

    def base_spec(self, name: str) -> HardwareSpec:
        return self._host.hardware_spec(name)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._host, name)


class RecordPredictor:
    """``(sample, values) -> predicted quantity`` for validation records: the record's
    hardware spec with the parameters' efficiency fields set to ``values``, predicted by
    :class:`~zrt_core.validate.Validator` (captures shared and cached as ``zrt validate``
    keeps them). None when zrt cannot predict the record."""

    def __init__(self, records: Sequence[Record], params: Sequence[Param], *,
                 host: PluginHost | None = None, frontend: str = "capture") -> None:
        from zrt_core.validate import Validator

        if host is None:
            from zrt_core.plugins import get_plugin_manager

            host = get_plugin_manager()
        self._host = _OverrideHost(host)
        self._validator = Validator(self._host, frontend=frontend)  # type: ignore[arg-type]
        self._records = {r.id: r for r in records}
        self._fields = {p.name: p.field for p in params}

    def __call__(self, sample: Sample, values: Mapping[str, float]) -> float | None:
        record = self._records[sample.id]
        try:
            base = self._host.base_spec(record.hardware)
        except ZrtError:
            return None
        changes = {self._fields[name]: value for name, value in values.items()}
        spec = evolve(base, efficiency=evolve(base.efficiency, **changes)) if changes else base
        self._host.overrides = {base.id: spec}
        try:
            result = self._validator.predict(record)
        finally:
            self._host.overrides = {}
        if not result.ok:
            return None
        return result.predicted.get(sample.quantity)


def fit_records(records: Sequence[Record], params: Sequence[Param], *,
                host: PluginHost | None = None, **options: Any) -> tuple[Fit, dict[str, Any]]:
    """Fit ``params`` on every record zrt predicts (:func:`~zrt_core.calibrate.fitting.fit`
    with :class:`RecordPredictor`); also returns each parameter's records and their MAPE at
    the shipped values and at the fitted ones (``{name: {"records", "shipped_mape",
    "fitted_mape"}}``). ``options`` go to the fit."""
    from zrt_core.calibrate.fitting import CachedPredictor, errors_at, fit, mape

    predict = CachedPredictor(RecordPredictor(records, params, host=host))
    shipped_values = {p.name: p.shipped for p in params}
    candidates = samples_from_records(records)
    shipped = errors_at(candidates, params, shipped_values, predict)
    samples = [s for s in candidates if shipped[s.id] is not None]
    result = fit(samples, params, predict, **options)
    fitted = errors_at(samples, params, result.values, predict)
    report = {}
    for p in params:
        ids = [s.id for s in samples if p.applies(s)]
        report[p.name] = {"records": len(ids), "shipped_mape": mape(shipped[i] for i in ids),
                          "fitted_mape": mape(fitted[i] for i in ids)}
    return result, report


__all__ = ["PACK_PARAMS", "QUANTITY", "RecordPredictor", "fit_records",
           "samples_from_records"]
