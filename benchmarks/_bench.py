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
