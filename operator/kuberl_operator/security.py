"""Security contexts. Learner and rollout pods meet Pod Security Standards *restricted*; the sandbox
server cannot (see `sandbox_container_security_context`) and gets the tightest context it can run with."""

from __future__ import annotations

from typing import Any

# A fixed non-root uid/gid: `runAsNonRoot` alone rejects images whose USER is root (most CUDA and vLLM
# images), while an explicit uid runs them unprivileged. 65532 is the conventional "nonroot" user.
NON_ROOT_UID = 65532

# What the sandbox server needs to give every session its own uid and every command its own PID
# namespace (docs/sandbox.md, env-images/sandbox/Dockerfile); every other capability is dropped.
SANDBOX_CAPABILITIES = ("CHOWN", "FOWNER", "KILL", "SETGID", "SETUID", "SYS_ADMIN")


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
    """RuntimeDefault seccomp still applies: its filter allows unshare(CLONE_NEWPID) to holders of
    CAP_SYS_ADMIN, which is all the server asks of it."""
    return {"seccompProfile": {"type": "RuntimeDefault"}}


def sandbox_container_security_context() -> dict[str, Any]:
    """Root with six capabilities: the server is a supervisor that setuid()s every command to the
    session's own unprivileged uid inside a fresh PID namespace, which needs root's CAP_SETUID/SETGID and
    CAP_SYS_ADMIN; no agent code ever runs as root. This cannot meet PSS restricted (or even baseline,
    which forbids SYS_ADMIN), and Kubernetes itself rejects allowPrivilegeEscalation: false beside
    CAP_SYS_ADMIN, so it is left unset. The compensations: all other capabilities dropped, read-only root
    filesystem, no service-account token, default-deny NetworkPolicy, and an optional gVisor/Kata
    runtimeClassName that puts the whole pod behind a second kernel boundary."""
    return {
        "runAsUser": 0,
        "runAsNonRoot": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"], "add": list(SANDBOX_CAPABILITIES)},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
