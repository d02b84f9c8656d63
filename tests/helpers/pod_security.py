"""The controls of Pod Security Standards *baseline* (kubernetes.io/docs/concepts/security/pod-security-standards,
as Pod Security admission enforces them from Kubernetes 1.35), checked on a pod spec: what admission in a
namespace labelled `pod-security.kubernetes.io/enforce: baseline` would refuse."""

from __future__ import annotations

from typing import Any

# the capabilities a container runtime (containerd, CRI-O) gives a container that names none
RUNTIME_CAPABILITIES = frozenset(
    [
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "NET_RAW",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    ]
)
# baseline lets a container add back what a runtime gives, but for raw sockets
BASELINE_CAPABILITIES = RUNTIME_CAPABILITIES - {"NET_RAW"}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def pss_baseline_violations(pod: dict[str, Any]) -> list[str]:
    """One line per baseline control the pod spec breaks; empty when admission would let it in."""
    found: list[str] = []
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            found.append(f"spec.{field}")
    found += _context_violations("spec.securityContext", pod.get("securityContext") or {})
    for sysctl in (pod.get("securityContext") or {}).get("sysctls", []):
        if sysctl["name"] not in SAFE_SYSCTLS:
            found.append(f"spec.securityContext.sysctls: {sysctl['name']}")
    found += [f"spec.volumes[{v['name']}].hostPath" for v in pod.get("volumes", []) if "hostPath" in v]
    user_namespace = pod.get("hostUsers") is False
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for container in pod.get(kind, []):
            where = f"spec.{kind}[{container['name']}]"
            context = container.get("securityContext") or {}
            found += _context_violations(f"{where}.securityContext", context)
            if context.get("privileged"):
                found.append(f"{where}.securityContext.privileged")
            added = set((context.get("capabilities") or {}).get("add", []))
            if added - BASELINE_CAPABILITIES:
                found.append(f"{where}.securityContext.capabilities: {sorted(added - BASELINE_CAPABILITIES)}")
            if context.get("procMount", "Default") != "Default" and not user_namespace:
                found.append(f"{where}.securityContext.procMount (Unmasked needs hostUsers: false)")
            found += [f"{where}.ports.hostPort" for p in container.get("ports", []) if p.get("hostPort")]
    return found


def _context_violations(where: str, context: dict[str, Any]) -> list[str]:
    found = []
    if (context.get("windowsOptions") or {}).get("hostProcess"):
        found.append(f"{where}.windowsOptions.hostProcess")
    if (context.get("appArmorProfile") or {}).get("type") not in (None, "RuntimeDefault", "Localhost"):
        found.append(f"{where}.appArmorProfile")
    if (context.get("seccompProfile") or {}).get("type") == "Unconfined":
        found.append(f"{where}.seccompProfile")
    selinux = context.get("seLinuxOptions") or {}
    if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
        found.append(f"{where}.seLinuxOptions")
    return found


def with_container_context(pod: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
    """The pod with its first container's security context replaced."""
    first, *rest = pod["containers"]
    return {**pod, "containers": [{**first, "securityContext": context}, *rest]}
