"""What every benchmark script prints for each target: one ``RESULT`` line that
``run_all.py`` collects into its summary.

    RESULT <script>: <what> = <measured> <unit> (target ≤ <target> <unit>) PASS|MISS
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: The shared folder beside the repository (``../shared`` from its root); ``ZRT_SHARED``
#: overrides it.
SHARED = Path(os.environ.get("ZRT_SHARED") or Path(__file__).resolve().parents[2] / "shared")
VALIDATION = SHARED / "validation" / "public.yaml"


def result(what: str, measured: float | None, target: float, unit: str, *,
           higher_is_better: bool = False) -> bool:
    """Print one target and its measurement; True when it is met (None never is)."""
    script = Path(sys.argv[0]).stem
    ok = measured is not None and (measured >= target if higher_is_better
                                   else measured <= target)
    sign = "≥" if higher_is_better else "≤"
    shown = "n/a" if measured is None else f"{measured:.4g}"
    print(f"RESULT {script}: {what} = {shown} {unit} (target {sign} {target:g} {unit}) "
          f"{'PASS' if ok else 'MISS'}", flush=True)
    return ok


def held_out_main(argv: list[str] | None, doc: str, default: Path, groups: tuple[str, ...],
                  keys_of, what: str) -> int:
    """A held-out bench's command line (``[FILE]``, default ``default``; ``doc``'s first line
    its description), then :func:`held_out_step_times` on the file."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("file", nargs="?", type=Path, default=default)
    return held_out_step_times(ap.parse_args(argv).file, groups, keys_of, what)


def held_out_step_times(path: Path, groups: tuple[str, ...], keys_of, what: str,
                        target: float = 0.10) -> int:
    """Predict a held-out training file and print its step-time MAPE and bias per group,
    overall, and the records not predicted; then its ``RESULT`` line against ``target``
    (issue 9's training target, 10%). ``keys_of(result, record)`` gives one key per name
    in ``groups`` for a predicted record."""
    from zrt_core.validate import Validator, load_records

    def line(name: str, errs: list[float]) -> str:
        mape = sum(abs(e) for e in errs) / len(errs)
        bias = sum(errs) / len(errs)
        return f"{name:36s} {len(errs):4d} {mape:7.1%} {bias:+8.1%}"

    records = load_records(path)
    by_id = {r.id: r for r in records}
    run = Validator().run(records, path=str(path))
    by: dict[str, dict[str, list[float]]] = {g: {} for g in groups}
    every: list[float] = []
    failed: list[str] = []
    for r in run.results:
        err = r.error.get("step_time_s")
        if err is None:
            failed.append(f"{r.id}: {r.message}")
            continue
        for group, key in zip(groups, keys_of(r, by_id[r.id]), strict=True):
            by[group].setdefault(key, []).append(err)
        every.append(err)
    for group, rows in by.items():
        print(f"{group:36s} {'n':>4s} {'MAPE':>7s} {'bias':>8s}")
        for key in sorted(rows):
            print(line(key, rows[key]))
        print()
    if every:
        print(line("all", every))
    for failure in failed:
        print(f"not predicted: {failure}")
    mape = sum(abs(e) for e in every) / len(every) if every else None
    result(what, None if mape is None else 100 * mape, 100 * target, "%")
    return 0
