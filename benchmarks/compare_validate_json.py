"""Compare two `zrt validate --json` files, ignoring wall-clock timing fields (elapsed_s).

Used to prove a refactor changes no prediction: exit 0 when identical, 1 with the differences.
"""

from __future__ import annotations

import json
import sys

# keys whose values are wall-clock measurements of the run itself, not predictions
TIMING_KEYS = frozenset({"elapsed_s"})


def _strip(obj: object) -> object:
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in TIMING_KEYS}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def _diff(a: object, b: object, path: str, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{path}.{k}: only in {'second' if k in b else 'first'}")
            else:
                _diff(a[k], b[k], f"{path}.{k}", out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _diff(x, y, f"{path}[{i}]", out)
    elif a != b or type(a) is not type(b):
        out.append(f"{path}: {a!r} != {b!r}")


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: compare_validate_json.py BEFORE.json AFTER.json", file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        before = _strip(json.load(f))
    with open(argv[2]) as f:
        after = _strip(json.load(f))
    # byte-level check of the canonical dump: same keys in the same order, same float repr
    same = json.dumps(before) == json.dumps(after)
    n = len(before.get("records", [])) if isinstance(before, dict) else 0
    if same:
        print(f"identical: {n} records (ignored: {', '.join(sorted(TIMING_KEYS))})")
        return 0
    diffs: list[str] = []
    _diff(before, after, "", diffs)
    print(f"DIFFERENT: {len(diffs)} differences over {n} records")
    for d in diffs[:50]:
        print("  " + d)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
