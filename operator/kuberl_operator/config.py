"""The operator's configuration, fixed at start-up and handed to `handlers.register`: the handlers read
nothing from the environment. `kuberl operator` builds it from the chart's environment variables and its
own flags."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kuberl.api import env_vars
from kuberl_operator.images import JobImages
from kuberl_operator.network_policy import NetworkPeers
from kuberl_operator.security import SandboxPodSecurity


@dataclass(frozen=True)
class OperatorConfig:
    """What one operator process is told at start-up; the same for every RLJob it serves."""

    interval_s: float = 3.0
    """Seconds between two observations of a job."""
    autoscale_interval_s: float = 15.0
    """Seconds between two sandbox autoscaling decisions of a job (each scrapes its rollout pods)."""
    metrics_port: int = 0
    """Port of the Prometheus metrics (the operator's and every job's); 0: none."""
    watch_nodes: bool = True
    """Watch nodes for spot capacity and preemption notices. Off where the operator may not list them: the
    node index must fill before any handler runs, so a forbidden list would stall the operator."""
    workers: int = 32
    """Handler threads: the handlers block on HTTP, and kopf's default pool (cores + 4) queues a burst."""
    watch_server_timeout_s: int = 300
    """Server-side timeout of every watch request: a watch that silently stops is kopf's known failure."""
    sandbox_security: SandboxPodSecurity = field(default_factory=SandboxPodSecurity)
    """What the cluster lets sandbox pods use."""
    network_peers: NetworkPeers = field(default_factory=NetworkPeers)
    """Who outside a job its NetworkPolicies admit: the operator itself, and Prometheus."""
    job_images: JobImages = field(default_factory=JobImages)
    """The images and pull secrets of the tiers of jobs that name none."""

    @staticmethod
    def from_env(env: Mapping[str, str]) -> OperatorConfig:
        """From the variables the chart sets (docs/helm.md); the defaults for those unset."""
        default = OperatorConfig()
        return OperatorConfig(
            interval_s=float(env.get(env_vars.OPERATOR_INTERVAL, default.interval_s)),
            autoscale_interval_s=float(env.get(env_vars.OPERATOR_AUTOSCALE_INTERVAL, default.autoscale_interval_s)),
            metrics_port=int(env.get(env_vars.OPERATOR_METRICS_PORT, default.metrics_port)),
            watch_nodes=env.get(env_vars.OPERATOR_WATCH_NODES, "1") == "1",
            workers=int(env.get(env_vars.OPERATOR_WORKERS, default.workers)),
            watch_server_timeout_s=int(env.get(env_vars.WATCH_SERVER_TIMEOUT, default.watch_server_timeout_s)),
            sandbox_security=SandboxPodSecurity.from_env(env),
            network_peers=NetworkPeers.from_env(env),
            job_images=JobImages.from_env(env),
        )
