"""Configuration of a sandbox server process, from flags or KUBERL_SANDBOX_* environment variables."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from kuberl.api import env_vars
from kuberl.api.sandbox_http import MAX_COMMAND_TIMEOUT_S
from kuberl_sandbox.programs import foreign_image

TOKEN_ENV = env_vars.SANDBOX_TOKEN
ADVERTISE_ENV = env_vars.SANDBOX_ADVERTISE_URL


@dataclass(frozen=True)
class CommandLimits:
    """Limits of one command: wall clock, rlimits, and how much output is kept."""

    timeout_s: float = 30.0
    """Wall-clock limit; the whole process tree is killed when it passes."""
    memory_bytes: int = 1 << 30
    """RLIMIT_AS of every process the command starts."""
    max_processes: int = 64
    """RLIMIT_NPROC: processes of the session's user at once (stops fork bombs)."""
    max_file_bytes: int = 64 << 20
    """RLIMIT_FSIZE: largest file a command may write."""
    max_open_files: int = 256
    """RLIMIT_NOFILE."""
    output_bytes: int = 64 << 10
    """Output kept (stdout and stderr together); a command that writes more is killed."""

    def cpu_seconds(self) -> int:
        """RLIMIT_CPU: a little above the wall clock so a busy loop dies by one or the other."""
        return int(self.timeout_s) + 2


@dataclass(frozen=True)
class SandboxSettings:
    """Everything a sandbox server needs to know."""

    root: Path
    """Directory holding one folder per session."""
    token: str
    """Shared secret callers present as `Authorization: Bearer <token>`."""
    limits: CommandLimits = field(default_factory=CommandLimits)
    """Default limits of one command."""
    max_timeout_s: float = MAX_COMMAND_TIMEOUT_S
    """Largest timeout a caller may ask for."""
    max_sessions: int = 2048
    """Sessions one process holds; creating more answers 503."""
    max_concurrent_commands: int = 64
    """Commands running at once; the rest wait (backpressure instead of an overloaded machine)."""
    max_body_bytes: int = 16 << 20
    """Largest request body; larger ones get 413."""
    advertise_url: str | None = None
    """This server's own address (in Kubernetes its pod IP), returned with every session it opens: callers
    send the session's later calls there, so sessions work behind a load-balanced Service."""
    uid_base: int = 200_000
    """First user id handed to sessions; each session gets its own unprivileged uid."""
    uid_block_size: int = 65_536
    """Uids of one server: each server on a host claims a block of its own (see `uids.py`) and hands its
    sessions uids from it, wrapping inside it; a uid comes back only after this many later sessions."""
    uid_blocks: int = 32
    """Blocks from `uid_base`: how many servers one host can run at once (uids up to about 2.3 million)."""
    python: str = "/usr/bin/python3"
    """Interpreter sessions see as `python` and `python3`."""
    observation_bytes: int = 4000
    """Tool observations longer than this are cut (the agent's context is precious)."""
    session_idle_s: float = 1800.0
    """Sessions unused for this long are closed (callers that vanished must not leak workspaces)."""
    test_outcomes_kept: int = 4096
    """Test outcomes kept by (task, hidden or not, workspace checksum) and reused for byte-identical files
    (outcome_cache.py): a few KiB each, the least recently used go first; 0 runs every test run."""
    allow_shared_user: bool = False
    """Start even when sessions cannot get users of their own (not root): development only."""
    repos: Path | None = None
    """A mirror of git repositories for tasks on real repositories (`owner__name`, bare or not); unset: such
    tasks are refused."""
    environments: Path | None = None
    """Prepared environments of those tasks (`kuberl tasks prepare`), shared read-only by their sessions."""
    egress: bool = False
    """Sessions reach out through a guarded user-mode network stack (session_network.py); else only their own
    loopback."""
    network_namespace: bool = True
    """Each session in a network namespace of its own. False (KUBERL_SANDBOX_NETWORK_NAMESPACE=0) only measures
    what it costs (bench_sandbox_sessions): sessions then reach everything the server reaches."""
    hidden: tuple[Path, ...] = ()
    """Folders sessions must not see beside the server's own installation (installation.py): a task store."""
    foreign_image: bool = False
    """The server runs from its portable bundle in a task's own image (KUBERL_SANDBOX_FOREIGN_IMAGE=1): a repository
    task's workspace is a copy of its workdir and commands run the image's environment (image_workspace.py)."""

    @staticmethod
    def from_env(root: str | None = None, token: str | None = None) -> SandboxSettings:
        """Settings from arguments, falling back to KUBERL_SANDBOX_ROOT and KUBERL_SANDBOX_TOKEN."""
        token = token or os.environ.get(TOKEN_ENV, "")
        if not token:
            raise ValueError(f"no token: set {TOKEN_ENV} (callers must send it as 'Authorization: Bearer <token>')")
        root_path = Path(root or os.environ.get(env_vars.SANDBOX_ROOT, "/tmp/kuberl-sandbox"))
        foreign = foreign_image()
        python = os.environ.get(env_vars.SANDBOX_PYTHON) or (_image_python() if foreign else _find_python())
        shared = os.environ.get(env_vars.SANDBOX_ALLOW_SHARED_USER, "") in ("1", "true", "yes")
        advertise = os.environ.get(ADVERTISE_ENV) or None
        repos, environments = (os.environ.get(name) for name in (env_vars.SANDBOX_REPOS, env_vars.SANDBOX_ENVIRONMENTS))
        egress = os.environ.get(env_vars.SANDBOX_EGRESS, "deny").strip().lower()
        if egress not in ("allow", "deny"):
            raise ValueError(f"{env_vars.SANDBOX_EGRESS}={egress!r}: expected allow or deny")
        hidden = tuple(Path(p) for p in os.environ.get(env_vars.SANDBOX_HIDDEN, "").split(":") if p)
        return SandboxSettings(
            root=root_path,
            token=token,
            python=python,
            allow_shared_user=shared,
            advertise_url=advertise,
            repos=Path(repos) if repos else None,
            environments=Path(environments) if environments else None,
            egress=egress == "allow",
            network_namespace=os.environ.get(env_vars.SANDBOX_NETWORK_NAMESPACE, "1") != "0",
            hidden=hidden,
            foreign_image=foreign,
        )


def _find_python() -> str:
    for candidate in ("/usr/local/bin/python3", "/usr/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate
    raise ValueError("no python3 for sessions: set KUBERL_SANDBOX_PYTHON")


def _image_python() -> str:
    """A task's own image: the first python3 on its PATH (checked when a session needs it, not at start)."""
    return shutil.which("python3") or shutil.which("python") or "/usr/bin/python3"
