"""Measure how ``build-tuned`` lands under other CPU kernels: ``python scripts/measure_rebuild_bands.py
[--settings native avx2 default] [--repeat 2]``.

Each setting of ``rlhf_tutorial.tiny.tuned.KERNEL_SETTINGS`` rebuilds the tiny world's tuned policy in a
fresh process (``--repeat`` times) and prints one JSON line: the setting, its environment, the kernel level
torch reported, the evaluation's reward and KL, the weights' sha256 and the wall time; a last line sums up
the range of each figure. ``REBUILD_BANDS`` in ``tiny/tuned.py`` is set from these lines (widened by a
margin) and names the runs that measured it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlhf_tutorial.tiny.tuned import KERNEL_SETTINGS, rebuild_in_subprocess  # noqa: E402

FIGURES = ("mean_reward_final", "kl_final")


def measure(name: str, out: Path) -> dict:
    """One rebuild under the named setting, as a JSON-able record."""
    start = time.perf_counter()
    summary = rebuild_in_subprocess(out, KERNEL_SETTINGS[name])
    return {"setting": name, "env": KERNEL_SETTINGS[name], "cpu_capability": summary["cpu_capability"],
            **{k: summary[k] for k in (*FIGURES, "mean_reward_initial", "policy_sha256")},
            "wall_seconds": round(time.perf_counter() - start, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--settings", nargs="+", default=list(KERNEL_SETTINGS), choices=list(KERNEL_SETTINGS))
    p.add_argument("--repeat", type=int, default=1, help="runs per setting (2: check run-to-run identity)")
    ns = p.parse_args(argv)
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in ns.settings:
            for i in range(ns.repeat):
                records.append(measure(name, Path(tmp) / f"{name}-{i}"))
                print(json.dumps(records[-1]), flush=True)
    ranges = {k: [min(r[k] for r in records), max(r[k] for r in records)] for k in FIGURES}
    digests = {r["setting"]: sorted({q["policy_sha256"] for q in records if q["setting"] == r["setting"]})
               for r in records}
    print(json.dumps({"ranges": ranges, "digests_per_setting": digests}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
