"""Run every benchmark and write one JSON result with the machine and the commit.

Each benchmark is a module in this folder named `bench_*.py` with a `run() -> dict` function that
returns its measurements. Results go to runs/bench/<UTC time>.json (and are printed).
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
    results = {}
    for path in sorted(HERE.glob("bench_*.py")):
        name = path.stem.removeprefix("bench_")
        if only and name not in only:
            continue
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module  # dataclasses resolve their annotations through sys.modules
        spec.loader.exec_module(module)
        print(f"[bench] {name} ...", flush=True)
        started = time.perf_counter()
        results[name] = {**module.run(), "wall_seconds": round(time.perf_counter() - started, 3)}
        print(f"[bench] {name}: {json.dumps(results[name])}", flush=True)
    report = {
        "time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": commit(),
        "machine": machine(),
        "results": results,
    }
    out = REPO / "runs" / "bench" / (report["time"].replace(":", "") + ".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"[bench] wrote {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
