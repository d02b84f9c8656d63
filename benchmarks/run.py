"""Run every benchmark (or those named: `run.py rollout checkpoint`) and write one result and one report.

Each benchmark is a module in this folder named `bench_*.py` with a `run() -> dict` function that
returns its measurements. Results go to runs/bench/<UTC time>/results.json with the machine and the commit
(and are printed); report.md and its plots go beside them (benchmarks/report.py), compared with
benchmarks/baseline.json.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from report import load_baseline, write_report  # noqa: E402 (benchmarks/ is not a package)


def machine() -> dict[str, object]:
    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    }


def commit() -> str:
    result = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    return result.stdout.strip() + ("-dirty" if dirty else "") if result.returncode == 0 else "unknown"


def main() -> int:
    only = set(sys.argv[1:])
    known = {path.stem.removeprefix("bench_") for path in HERE.glob("bench_*.py")}
    if unknown := sorted(only - known):
        print(f"unknown benchmark(s) {unknown}; expected names from {sorted(known)}", file=sys.stderr)
        return 2
    started_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    folder = REPO / "runs" / "bench" / started_at.replace(":", "")
    report = {"time": started_at, "commit": commit(), "machine": machine(), "results": {}, "failed": {}}
    baseline = load_baseline()
    for path in sorted(HERE.glob("bench_*.py")):
        name = path.stem.removeprefix("bench_")
        if only and name not in only:
            continue
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module  # dataclasses resolve their annotations through sys.modules
        print(f"[bench] {name} ...", flush=True)
        started = time.perf_counter()
        try:
            spec.loader.exec_module(module)
            report["results"][name] = {**module.run(), "wall_seconds": round(time.perf_counter() - started, 3)}
            print(f"[bench] {name}: {json.dumps(report['results'][name])}", flush=True)
        except Exception as error:  # one broken benchmark must not lose the others' numbers
            report["failed"][name] = f"{type(error).__name__}: {error}"[:2000]
            print(f"[bench] {name} FAILED: {report['failed'][name]}", flush=True)
        # written after every benchmark: a run stopped half-way keeps what it measured
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "results.json").write_text(json.dumps(report, indent=2) + "\n")
        write_report(report, folder, baseline)
    print(f"[bench] wrote {(folder / 'results.json').relative_to(REPO)} and report.md beside it")
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
