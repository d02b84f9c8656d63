"""Security contexts. Learner and rollout pods meet Pod Security Standards *restricted*; the sandbox
server cannot (see `sandbox_container_security_context`) and gets the tightest context it can run with."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kuberl.api import env_vars

# A fixed non-root uid/gid: `runAsNonRoot` alone rejects images whose USER is root (most CUDA and vLLM
# images), while an explicit uid runs them unprivileged. 65532 is the conventional "nonroot" user.
NON_ROOT_UID = 65532

# Every capability the sandbox supervisor keeps, with the reason; all others are dropped. The server runs
# each command as `unshare --mount --pid --fork --mount-proc` + bind mounts + `setpriv --reuid --regid
# --clear-groups --no-new-privs`, and file operations under the session's per-thread setfsuid/setfsgid
# (docs/sandbox.md, env-images/sandbox/Dockerfile). tests/operator/test_sandbox_pod_rights.py runs the
# server with exactly this set.
SANDBOX_CAPABILITIES: dict[str, str] = {
    "CHOWN": "hand a new session its folders (work/, tmp/, its private /tmp and /dev/shm) as its own uid",
    "DAC_OVERRIDE": "start a command in, and remove at close, a session's 0700 folders while still root "
    "(with the session's fsuid the kernel drops it anyway)",
    "FOWNER": "remove at close what a session left in sticky (1777) folders of its own: unlinking another "
    "user's file from a sticky folder needs it",
    "KILL": "kill a command that overran: it runs as the session's uid, not the server's",
    "SETGID": "setpriv --regid --clear-groups and setfsgid: act as the session's gid, with no other group",
    "SETUID": "setpriv --reuid and setfsuid: act as the session's own unprivileged uid",
    "SYS_ADMIN": "unshare the mount and PID namespaces of every command, mount its /proc and bind-mount "
    "its private /tmp, /var/tmp, /dev/shm and /run/lock",
}

# The operator's environment (the chart's operator.sandbox* values) chooses what a cluster supports.
USER_NAMESPACE_ENV = env_vars.OPERATOR_SANDBOX_USER_NAMESPACE
APPARMOR_ENV = env_vars.OPERATOR_SANDBOX_APPARMOR_PROFILE


@dataclass(frozen=True)
class SandboxPodSecurity:
    """What the cluster lets sandbox pods use, the same for every RLJob an operator serves."""

    user_namespace: bool = True
    """`hostUsers: false`: the supervisor's root (and its capabilities) belong to the pod's own user
    namespace, mapped to an unprivileged host uid range. Needs Kubernetes 1.33+ (1.30-1.32 with the
    UserNamespacesSupport gate), Linux 6.3+ and containerd 2.0+ or CRI-O 1.25+ with runc or crun."""
    apparmor_profile: str = "unconfined"
    """`unconfined`, `runtime/default` or `localhost/<profile>`. The runtimes' default profile denies
    mount(2) even to CAP_SYS_ADMIN, and the server mounts every command's /proc and /tmp, so the default
    is unconfined; a node-installed profile that allows those mounts can take its place."""

    @staticmethod
    def from_env(env: Mapping[str, str] = os.environ) -> SandboxPodSecurity:
        return SandboxPodSecurity(
            user_namespace=env.get(USER_NAMESPACE_ENV, "1").strip().lower() not in ("0", "false", "no"),
            apparmor_profile=env.get(APPARMOR_ENV, "").strip() or "unconfined",
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


def sandbox_pod_security_context() -> dict[str, Any]:
    """RuntimeDefault seccomp still applies: its filter allows unshare(2) and mount(2) to holders of
    CAP_SYS_ADMIN, which is all the server asks of it."""
    return {"seccompProfile": {"type": "RuntimeDefault"}}


def sandbox_uses_user_namespace(security: SandboxPodSecurity, runtime_class_name: str | None) -> bool:
    """A RuntimeClass (gVisor, Kata) gives the pod a kernel of its own, and the kubelet refuses
    `hostUsers: false` for runtimes that do not announce user-namespace support, which they do not."""
    return security.user_namespace and not runtime_class_name


def sandbox_container_security_context(security: SandboxPodSecurity) -> dict[str, Any]:
    """Root with the capabilities of SANDBOX_CAPABILITIES: the server is a supervisor that runs every
    command as the session's own unprivileged uid, with no_new_privs, in fresh mount and PID namespaces;
    no agent code ever runs as root. With `hostUsers: false` that root is the pod's user namespace's, not
    the node's. This cannot meet PSS restricted (nor baseline, which forbids SYS_ADMIN).

    allowPrivilegeEscalation is left unset (true): Kubernetes rejects `false` beside CAP_SYS_ADMIN (its
    check misses only the `SYS_ADMIN` spelling, a gap not to build on), and no_new_privs would not bind a
    process that already holds CAP_SYS_ADMIN; what it is for, agent commands, get it from `setpriv
    --no-new-privs`. The compensations: every other capability dropped, seccomp RuntimeDefault, a
    read-only root filesystem, no service-account token, the default-deny NetworkPolicy, and the optional
    gVisor/Kata runtimeClassName."""
    return {
        "runAsUser": 0,
        "runAsNonRoot": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"], "add": sorted(SANDBOX_CAPABILITIES)},
        "seccompProfile": {"type": "RuntimeDefault"},
        "appArmorProfile": apparmor_profile(security.apparmor_profile),
    }


def apparmor_profile(name: str) -> dict[str, str]:
    """An AppArmor profile in the notation of the old annotation (`unconfined`, `runtime/default`,
    `localhost/<profile>`) as the securityContext field."""
    if name == "unconfined":
        return {"type": "Unconfined"}
    if name == "runtime/default":
        return {"type": "RuntimeDefault"}
    if name.startswith("localhost/") and name.removeprefix("localhost/"):
        return {"type": "Localhost", "localhostProfile": name.removeprefix("localhost/")}
    raise ValueError(f"{APPARMOR_ENV}={name!r}: expected unconfined, runtime/default or localhost/<profile>")
