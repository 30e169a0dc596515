"""Check that the installed zrt-acme pack is discovered by the `zrt` command.

Run by ``nox -s external_pack`` after ``pip install tests/external_pack`` next to
zrt-core; exits non-zero with one line saying what is missing.
"""

from __future__ import annotations

import json
import subprocess
import sys

HARDWARE_ID = "acme_a1"
DISTRIBUTION = "zrt-acme"


def zrt_json(*args: str) -> dict:
    proc = subprocess.run(["zrt", *args, "--json"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"`zrt {' '.join(args)} --json` failed ({proc.returncode}): {proc.stderr}")
    return json.loads(proc.stdout)


def main() -> int:
    rows = {h["id"]: h for h in zrt_json("hw", "list")["hardware"]}
    if HARDWARE_ID not in rows:
        sys.exit(f"`zrt hw list` does not show {HARDWARE_ID}: it shows {sorted(rows)}")
    if rows[HARDWARE_ID]["distribution"] != DISTRIBUTION:
        sys.exit(f"{HARDWARE_ID} is attributed to {rows[HARDWARE_ID]['distribution']!r}")

    plugins = {p["distribution"]: p for p in zrt_json("plugins")["plugins"]}
    if DISTRIBUTION not in plugins:
        sys.exit(f"`zrt plugins` does not name {DISTRIBUTION}: it names {sorted(plugins)}")
    contributed = plugins[DISTRIBUTION]["contributions"].get("zrt_hardware_specs", [])
    if contributed != [HARDWARE_ID]:
        sys.exit(f"`zrt plugins` says {DISTRIBUTION} contributes {contributed}")

    shown = zrt_json("hw", "show", "a1")
    if shown["id"] != HARDWARE_ID or shown["compute"]["bf16_tflops"] != 600:
        sys.exit(f"`zrt hw show a1` gave {shown['id']} at {shown['compute']['bf16_tflops']}")

    print(f"external pack ok: {DISTRIBUTION} {plugins[DISTRIBUTION]['version']} contributes "
          f"{HARDWARE_ID} (alias a1); {len(rows)} hardware ids installed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
