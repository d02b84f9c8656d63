"""Security contexts. Learner and rollout pods meet Pod Security Standards *restricted*; sandbox pods meet
*baseline* (see `sandbox_container_security_context`: the server is a root supervisor with a few capabilities of
the baseline list, and isolates sessions with unprivileged user namespaces)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kuberl.api import env_vars

# A fixed non-root uid/gid: `runAsNonRoot` alone rejects images whose USER is root (most CUDA and vLLM
# images), while an explicit uid runs them unprivileged. 65532 is the conventional "nonroot" user.
NON_ROOT_UID = 65532

# Every capability the sandbox supervisor keeps, with the reason; all others are dropped. Each is on the list
# PSS baseline allows. The server runs each command as the session's uid (`setpriv --reuid --regid
# --clear-groups --no-new-privs`) in the session's unprivileged user namespace, where it makes its mount, PID,
# IPC and network namespaces with no capability of the pod's, and file operations under the session's
# per-thread setfsuid/setfsgid (docs/sandbox.md, env-images/sandbox/Dockerfile).
# tests/operator/test_sandbox_pod_rights.py runs the server with exactly this set.
SANDBOX_CAPABILITIES: dict[str, str] = {
    "CHOWN": "hand a new session its folders (work/, tmp/, its private /tmp and /dev/shm) as its own uid",
    "DAC_OVERRIDE": "start a command in, and remove at close, a session's 0700 folders while still root "
    "(with the session's fsuid the kernel drops it anyway)",
    "FOWNER": "remove at close what a session left in sticky (1777) folders of its own: unlinking another "
    "user's file from a sticky folder needs it",
    "KILL": "kill a command that overran, and a session's namespace holder: they run as the session's uid",
    "SETGID": "setpriv --regid --clear-groups and setfsgid: act as the session's gid, with no other group",
    "SETUID": "setpriv --reuid and setfsuid: act as the session's own unprivileged uid",
}

# The operator's environment (the chart's operator.sandbox* values) chooses what a cluster supports.
USER_NAMESPACE_ENV = env_vars.OPERATOR_SANDBOX_USER_NAMESPACE
APPARMOR_ENV = env_vars.OPERATOR_SANDBOX_APPARMOR_PROFILE
SECCOMP_ENV = env_vars.OPERATOR_SANDBOX_SECCOMP_PROFILE


@dataclass(frozen=True)
class SandboxPodSecurity:
    """What the cluster lets sandbox pods use, the same for every RLJob an operator serves."""

    user_namespace: bool = True
    """`hostUsers: false`: the supervisor's root (and its capabilities) belong to the pod's own user
    namespace, mapped to an unprivileged host uid range. Needs Kubernetes 1.33+ (1.30-1.32 with the
    UserNamespacesSupport gate), Linux 6.3+ and containerd 2.0+ or CRI-O 1.25+ with runc or crun."""
    apparmor_profile: str = ""
    """Empty (the node's default), `runtime/default`, `localhost/<profile>` or `unconfined`. The runtimes'
    default AppArmor profile denies mount(2), which every command needs inside its session's user namespace:
    on nodes with AppArmor, load the chart's profile (charts/kuberl/files/kuberl-sandbox.apparmor) and name
    it here. `unconfined` works anywhere but is beyond PSS baseline."""
    seccomp_profile: str = ""
    """Empty (none stated: the node's default, unconfined unless the kubelet runs with --seccomp-default),
    `runtime/default` or `localhost/<file>`. The runtimes' default seccomp profile denies unshare(2), setns(2)
    and mount(2) to a container without CAP_SYS_ADMIN, so sessions cannot be isolated under it."""

    @staticmethod
    def from_env(env: Mapping[str, str] = os.environ) -> SandboxPodSecurity:
        return SandboxPodSecurity(
            user_namespace=env.get(USER_NAMESPACE_ENV, "1").strip().lower() not in ("0", "false", "no"),
            apparmor_profile=env.get(APPARMOR_ENV, "").strip(),
            seccomp_profile=env.get(SECCOMP_ENV, "").strip(),
        )


def restricted_pod_security_context() -> dict[str, Any]:
    """Pod-level part of PSS restricted: non-root, RuntimeDefault seccomp; fsGroup makes emptyDirs writable."""
    return {
        "runAsNonRoot": True,
        "runAsUser": NON_ROOT_UID,
        "runAsGroup": NON_ROOT_UID,
        "fsGroup": NON_ROOT_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def restricted_container_security_context() -> dict[str, Any]:
    """Container-level part of PSS restricted, plus a read-only root filesystem (writes go to emptyDirs)."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def sandbox_pod_security_context(security: SandboxPodSecurity) -> dict[str, Any]:
    """Only a seccomp profile, when one is named (see SandboxPodSecurity.seccomp_profile)."""
    return {"seccompProfile": profile(SECCOMP_ENV, security.seccomp_profile)} if security.seccomp_profile else {}


def sandbox_uses_user_namespace(security: SandboxPodSecurity, runtime_class_name: str | None) -> bool:
    """A RuntimeClass (gVisor, Kata) gives the pod a kernel of its own, and the kubelet refuses
    `hostUsers: false` for runtimes that do not announce user-namespace support, which they do not."""
    return security.user_namespace and not runtime_class_name


def sandbox_container_security_context(security: SandboxPodSecurity, user_namespace: bool) -> dict[str, Any]:
    """Root with the capabilities of SANDBOX_CAPABILITIES (all on PSS baseline's list), no privilege
    escalation: the server is a supervisor that runs every command as the session's own unprivileged uid,
    with no_new_privs, in the session's unprivileged user namespace; no agent code ever runs as root. With
    `hostUsers: false` that root is the pod's user namespace's, not the node's, and /proc is unmasked
    (`procMount: Unmasked`): a command's PID namespace needs a /proc of its own, which the kernel refuses to
    mount beside the runtime's masks. PSS baseline allows it for user-namespaced pods from Kubernetes 1.35.
    Beside: a read-only root filesystem, no service-account token, default-deny NetworkPolicy, and the optional
    gVisor/Kata runtimeClassName."""
    context: dict[str, Any] = {
        "runAsUser": 0,
        "runAsNonRoot": False,
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"], "add": sorted(SANDBOX_CAPABILITIES)},
    }
    if user_namespace:
        context["procMount"] = "Unmasked"
    if security.seccomp_profile:
        context["seccompProfile"] = profile(SECCOMP_ENV, security.seccomp_profile)
    if security.apparmor_profile:
        context["appArmorProfile"] = profile(APPARMOR_ENV, security.apparmor_profile)
    return context


def profile(setting: str, name: str) -> dict[str, str]:
    """An AppArmor or seccomp profile in the notation of the old annotations (`unconfined`,
    `runtime/default`, `localhost/<profile>`) as the securityContext field."""
    if name == "unconfined":
        return {"type": "Unconfined"}
    if name == "runtime/default":
        return {"type": "RuntimeDefault"}
    if name.startswith("localhost/") and name.removeprefix("localhost/"):
        return {"type": "Localhost", "localhostProfile": name.removeprefix("localhost/")}
    raise ValueError(f"{setting}={name!r}: expected unconfined, runtime/default or localhost/<profile>")
