"""Many RLJobs created at once against an emulated API server (kmock) with the real operator process.

Reported: seconds from each job's create until every one of its children exists (p50, p99, max), the
seconds from the last create until the last job is complete, and the operator's peak RSS. Goal (issue 7):
p99 <= 5 s after the last create and RSS <= 300 MB for 1,000 jobs. KUBERL_BENCH_JOBS sets the count.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

JOBS = int(os.environ.get("KUBERL_BENCH_JOBS", "1000"))
NS = "default"
TIMEOUT_S = 1800.0
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


def manifest(name: str) -> dict:
    return {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLJob",
            "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": "1"},
            "spec": {"learner": {"replicas": 2}, "rollout": {"replicas": 2},
                     "checkpoint": {"uri": f"s3://ckpt/{name}"}}}  # fmt: skip


def children_per_job(api) -> dict[str, int]:
    from kuberl_operator.meta import JOB_LABEL

    counts: dict[str, int] = {}
    for path in COLLECTIONS:
        for item in api.items(path):
            job = (item["metadata"].get("labels") or {}).get(JOB_LABEL)
            if job:
                counts[job] = counts.get(job, 0) + 1
    return counts


def run() -> dict[str, object]:
    from kuberl.api.rljob import RLJob
    from kuberl_operator.desired import desired_objects
    from kuberl_operator.emulator import HANDLERS, Api, OperatorProcess, emulated_api_server, write_kubeconfig

    expected = len(desired_objects(RLJob.from_manifest(manifest("probe")), NS, owner=None)) + 1  # + token Secret
    names = [f"scale-{i:04d}" for i in range(JOBS)]
    with tempfile.TemporaryDirectory(prefix="kuberl-operator-scale-") as tmp, emulated_api_server() as url:
        api = Api(url)
        operator = OperatorProcess(write_kubeconfig(Path(tmp) / "kubeconfig", url, NS), Path(tmp) / "operator.log")
        operator.start([sys.executable, *HANDLERS])
        try:
            time.sleep(5)  # the operator's watches are up before the burst
            created: dict[str, float] = {}

            def create(name: str) -> None:
                api.post(f"/apis/kuberl.io/v1alpha1/namespaces/{NS}/rljobs", manifest(name))
                created[name] = time.monotonic()

            with ThreadPoolExecutor(8) as pool:
                list(pool.map(create, names))
            last_create = max(created.values())
            print(f"[bench]   {JOBS} RLJobs created in {last_create - min(created.values()):.1f} s", flush=True)
            done: dict[str, float] = {}
            peak_rss = 0
            while len(done) < JOBS and time.monotonic() - last_create < TIMEOUT_S:
                counts = children_per_job(api)
                now = time.monotonic()
                for name in names:
                    if name not in done and counts.get(name, 0) >= expected:
                        done[name] = now
                peak_rss = max(peak_rss, operator.peak_rss_bytes() or 0)
                print(f"[bench]   {len(done)}/{JOBS} jobs have all {expected} children, "
                      f"{now - last_create:.0f} s after the last create", flush=True)  # fmt: skip
                time.sleep(1.0)
        finally:
            operator.stop()
    latencies = sorted(done[n] - created[n] for n in done)
    return {
        "jobs": JOBS,
        "children_per_job": expected,
        "complete": len(done),
        "p50_s": round(statistics.median(latencies), 1) if latencies else None,
        "p99_s": round(latencies[max(0, int(0.99 * len(latencies)) - 1)], 1) if latencies else None,
        "max_s": round(latencies[-1], 1) if latencies else None,
        "last_complete_after_last_create_s": round(max(done.values()) - last_create, 1) if done else None,
        "operator_peak_rss_mb": round(peak_rss / 2**20, 1),
        "poll_resolution_s": 1.0,
    }


if __name__ == "__main__":
    print(run())
