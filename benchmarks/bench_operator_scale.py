"""Many RLJobs created at once against an emulated API server (kmock) with the real operator process.

Reported: seconds from each job's create until every one of its children exists (p50, p99, max), the
seconds from the last create until the last job is complete, the operator's peak RSS, and the CPU it uses
afterwards (cores, over STEADY_S) to keep observing every job. Goal:
p99 <= 5 s after the last create and RSS <= 300 MB for 1,000 jobs. KUBERL_BENCH_JOBS sets the count.

The emulator serves every request on one Python thread of this process, on the same cores as the operator,
so it is measured too, in the same run: `emulator_floor_s` is how long it takes to serve the same creates
with no operator at all (one client writing every child object of every job, nothing else). The operator
cannot finish sooner than that here; a real API server is neither single-threaded nor on the same cores.
When a job's children were all written is read from the operator's log (its "applied" line, stamped to the
millisecond): polling the emulator for them would load the very server being measured. The children of
every job are then counted in full through the API, and only jobs that have them all count as complete.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

# The API emulator is a test harness (tests/helpers/emulator.py), not part of the shipped operator.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

JOBS = int(os.environ.get("KUBERL_BENCH_JOBS", "1000"))
NS = "default"
TIMEOUT_S = 1800.0
STEADY_S = 20.0
# every kind the operator creates for a job (desired_objects, plus the sandbox token Secret)
COLLECTIONS = [
    f"/api/v1/namespaces/{NS}/serviceaccounts",
    f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/roles",
    f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/rolebindings",
    f"/api/v1/namespaces/{NS}/configmaps",
    f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies",
    f"/api/v1/namespaces/{NS}/services",
    f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets",
    f"/apis/apps/v1/namespaces/{NS}/deployments",
    f"/apis/apps/v1/namespaces/{NS}/statefulsets",
    f"/api/v1/namespaces/{NS}/secrets",
]


# kopf's log line: "[2026-11-30 14:40:00,123] kopf.objects [INFO] [default/scale-0001] applied Secret/..."
APPLIED = re.compile(r"^\[(?P<at>[\d-]+ [\d:]+,\d+)\] \S+ +\[INFO *\] \[[^/\]]+/(?P<job>[^\]]+)\] applied ", re.M)


def applied_at(log: str, jobs: set[str]) -> dict[str, float]:
    """Epoch seconds of each job's first "applied" line (kopf stamps local time)."""
    out: dict[str, float] = {}
    for match in APPLIED.finditer(log):
        if match["job"] in jobs and match["job"] not in out:
            out[match["job"]] = datetime.strptime(match["at"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return out


def manifest(name: str) -> dict:
    return {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"learner": {"replicas": 2}, "rollout": {"replicas": 2}, "checkpoint": {"uri": f"s3://ckpt/{name}"}},
    }


def children_per_job(api) -> dict[str, int]:
    from kuberl_operator.meta import JOB_LABEL

    counts: dict[str, int] = {}
    for path in COLLECTIONS:
        for item in api.items(path):
            job = (item["metadata"].get("labels") or {}).get(JOB_LABEL)
            if job:
                counts[job] = counts.get(job, 0) + 1
    return counts


def emulator_floor_s(objects_per_job: list[dict], jobs: int) -> float:
    """Seconds for a fresh emulator to take `jobs` jobs' worth of creates from 8 client threads in another
    process (as the operator is), with nothing else running."""
    from helpers.emulator import emulated_api_server

    with emulated_api_server() as url, tempfile.NamedTemporaryFile("w", suffix=".json") as spec:
        json.dump({"url": url, "jobs": jobs, "objects": objects_per_job}, spec)
        spec.flush()
        start = time.monotonic()
        subprocess.run([sys.executable, __file__, "--floor-client", spec.name], check=True)
        return time.monotonic() - start


def floor_client(spec_path: str) -> None:
    from helpers.emulator import Api

    from kuberl.kube import collection_path

    spec = json.loads(Path(spec_path).read_text())
    api = Api(spec["url"])

    def create_all(index: int) -> None:
        for obj in spec["objects"]:
            meta = {**obj["metadata"], "name": f"{obj['metadata']['name']}-{index}"}
            api.post(collection_path(obj["apiVersion"], obj["kind"], NS), {**obj, "metadata": meta})

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create_all, range(spec["jobs"])))


def create_jobs(url: str, names: list[str]) -> dict[str, float]:
    """Create the RLJobs from 8 client threads in another process, as the floor's creates are made (in this
    one they would hold the emulator's interpreter lock), and return when each create was answered."""
    with tempfile.TemporaryDirectory() as tmp:
        spec, out = Path(tmp) / "spec.json", Path(tmp) / "created.json"
        spec.write_text(json.dumps({"url": url, "names": names, "out": str(out)}))
        subprocess.run([sys.executable, __file__, "--create-client", str(spec)], check=True)
        return json.loads(out.read_text())


def create_client(spec_path: str) -> None:
    from helpers.emulator import Api

    spec = json.loads(Path(spec_path).read_text())
    api, created = Api(spec["url"]), {}

    def create(name: str) -> None:
        api.post(f"/apis/kuberl.io/v1alpha1/namespaces/{NS}/rljobs", manifest(name))
        created[name] = time.time()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, spec["names"]))
    Path(spec["out"]).write_text(json.dumps(created))


def run() -> dict[str, object]:
    from helpers.emulator import HANDLERS, Api, OperatorProcess, emulated_api_server, write_kubeconfig

    from kuberl.api.rljob import RLJob
    from kuberl_operator.desired import desired_objects

    probe = desired_objects(RLJob.from_manifest(manifest("probe")), NS, owner=None)
    expected = len(probe) + 1  # + the sandbox token Secret
    print(f"[bench] emulator floor: {JOBS} jobs' worth of creates, no operator", flush=True)
    floor = emulator_floor_s([*probe, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "token"}}], JOBS)
    print(f"[bench]   {floor:.1f} s", flush=True)
    names = [f"scale-{i:04d}" for i in range(JOBS)]
    with tempfile.TemporaryDirectory(prefix="kuberl-operator-scale-") as tmp, emulated_api_server() as url:
        api = Api(url)
        operator = OperatorProcess(write_kubeconfig(Path(tmp) / "kubeconfig", url, NS), Path(tmp) / "operator.log")
        operator.start([sys.executable, *HANDLERS])
        try:
            time.sleep(5)  # the operator's watches are up before the burst
            created = create_jobs(url, names)
            last_create = max(created.values())
            print(f"[bench]   {JOBS} RLJobs created in {last_create - min(created.values()):.1f} s", flush=True)
            peak_rss, shown, done = 0, 0.0, {}
            while len(done) < JOBS and time.time() - last_create < TIMEOUT_S:
                time.sleep(1.0)
                done = applied_at(operator.log.read_text(errors="replace"), set(created))
                peak_rss = max(peak_rss, operator.peak_rss_bytes() or 0)
                if time.time() - shown >= 5 or len(done) == JOBS:
                    print(
                        f"[bench]   {len(done)}/{JOBS} jobs have their children, "
                        f"{time.time() - last_create:.0f} s after the last create",
                        flush=True,
                    )
                    shown = time.time()
            counts = children_per_job(api)
            # the steady state: every job observed each interval, nothing changing
            before, start = operator.cpu_seconds(), time.monotonic()
            time.sleep(STEADY_S)
            steady_cpu = (operator.cpu_seconds() - before) / (time.monotonic() - start)
        finally:
            operator.stop()
    complete = {n for n in done if counts.get(n, 0) >= expected}
    latencies = sorted(done[n] - created[n] for n in complete)
    return {
        "jobs": JOBS,
        "children_per_job": expected,
        "complete": len(complete),
        "p50_s": round(statistics.median(latencies), 1) if latencies else None,
        "p99_s": round(latencies[max(0, int(0.99 * len(latencies)) - 1)], 1) if latencies else None,
        "max_s": round(latencies[-1], 1) if latencies else None,
        "last_complete_after_last_create_s": round(max(done[n] for n in complete) - last_create, 1)
        if complete
        else None,
        "create_burst_s": round(last_create - min(created.values()), 1),
        "emulator_floor_s": round(floor, 1),
        "operator_peak_rss_mb": round(peak_rss / 2**20, 1),
        "operator_steady_cpu_cores": round(steady_cpu, 3),
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["--floor-client"]:
        floor_client(sys.argv[2])
    elif sys.argv[1:2] == ["--create-client"]:
        create_client(sys.argv[2])
    else:
        print(run())
