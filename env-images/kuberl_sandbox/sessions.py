"""Sessions: one isolated workspace and user per agent episode, with the tools the agent uses.

A session is created from a task (or from a snapshot taken on any server), runs one command at a time,
and keeps the log of its mutating actions so its state can be explained and rebuilt.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
import secrets
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from kuberl.api.environment import Snapshot, Task
from kuberl.errors import ServiceError
from kuberl_sandbox import workspace as ws
from kuberl_sandbox.execution import CommandResult, Identity, namespaces_available, run_command
from kuberl_sandbox.metrics import SandboxMetrics
from kuberl_sandbox.settings import CommandLimits, SandboxSettings
from kuberl_sandbox.testrun import Resolution, TestOutcome, count_test_methods, summarize

HIDDEN_DIR = "hidden"
log = logging.getLogger("kuberl.sandbox")


def isolation_problem(settings: SandboxSettings, isolated: bool) -> str | None:
    """Why this server must not start, if sessions cannot be isolated and that was not allowed."""
    if isolated or settings.allow_shared_user:
        return None
    return (
        "cannot give sessions users and PID namespaces of their own (needs root with CAP_SETUID, CAP_SETGID and "
        "CAP_SYS_ADMIN, and util-linux unshare); refusing to run agent code unisolated. "
        "For development only, set KUBERL_SANDBOX_ALLOW_SHARED_USER=1."
    )


class SessionError(ServiceError):
    """A request about sessions that cannot be served."""


@dataclass
class Session:
    session_id: str
    task: Task
    identity: Identity
    home: Path
    """The session's folder: work/ (the agent's workspace), tmp/ and hidden/ (tests the agent never sees)."""
    limits: CommandLimits
    created: float = field(default_factory=time.time)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    actions: list[dict[str, object]] = field(default_factory=list)
    commands: int = 0
    last_used: float = field(default_factory=time.monotonic)

    @property
    def workspace(self) -> Path:
        return self.home / "work"

    @property
    def owner(self) -> tuple[int, int] | None:
        return (self.identity.uid, self.identity.gid) if self.identity.isolated else None


class SessionManager:
    """Every session of one server process."""

    def __init__(self, settings: SandboxSettings, metrics: SandboxMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.sessions: dict[str, Session] = {}
        self.isolated = False  # decided by prepare()
        self._uids = itertools.count()
        self._slots = asyncio.Semaphore(settings.max_concurrent_commands)
        self._bin = settings.root / ".bin"

    # ------------------------------------------------------------------------------ lifecycle
    def prepare(self) -> None:
        """Create the root folder (reachable, not listable, by session users) and the `python` shim."""
        root = self.settings.root
        self.isolated = namespaces_available(self.settings.uid_base)
        if problem := isolation_problem(self.settings, self.isolated):
            raise RuntimeError(problem)
        if not self.isolated:
            log.warning("sandbox is NOT isolated: sessions share one user; development only")
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o711)
        for parent in root.resolve().parents:
            if self.isolated and not os.stat(parent).st_mode & 0o001:
                raise RuntimeError(f"sandbox root {root} is not reachable by session users: {parent} is not o+x")
        self._bin.mkdir(exist_ok=True)
        os.chmod(self._bin, 0o755)
        for name in ("python", "python3"):
            link = self._bin / name
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(self.settings.python)

    async def create(self, task: Task, timeout_s: float | None = None) -> Session:
        """A new session whose workspace holds the task's files."""
        session = self._new_session(task, timeout_s)
        try:
            for path, content in task.files.items():
                ws.write_text(session.workspace, path, content, session.owner)
            hidden = session.home / HIDDEN_DIR
            for path, content in task.hidden_tests.items():
                ws.write_text(hidden, path, content, None)  # root-owned, 0700 folder: unreadable to the agent
        except ws.WorkspaceError as err:
            self._remove(session)
            raise SessionError(400, str(err)) from None
        self._register(session)
        return session

    async def restore(self, task: Task, snapshot: Snapshot) -> Session:
        """A new session rebuilt from a snapshot taken on any server; its checksum must match."""
        session = self._new_session(task, None)
        try:
            # archives can be large: unpack off the event loop so other sessions keep being served
            await asyncio.to_thread(
                ws.extract, snapshot.data, session.workspace, session.owner, self.settings.max_body_bytes * 8
            )
            for path, content in task.hidden_tests.items():
                ws.write_text(session.home / HIDDEN_DIR, path, content, None)
        except ws.WorkspaceError as err:
            self._remove(session)
            raise SessionError(400, str(err)) from None
        actual = await asyncio.to_thread(ws.checksum, session.workspace)
        if actual != snapshot.checksum:
            self._remove(session)
            raise SessionError(409, f"restored workspace checksum {actual[:12]} != snapshot {snapshot.checksum[:12]}")
        session.actions = list(snapshot.actions)
        self._register(session)
        return session

    def snapshot(self, session: Session) -> Snapshot:
        return Snapshot(
            session_id=session.session_id,
            task_id=session.task.task_id,
            checksum=ws.checksum(session.workspace),
            data=ws.archive(session.workspace),
            actions=list(session.actions),
        )

    async def close(self, session_id: str) -> None:
        session = self.get(session_id)
        async with session.lock:
            self._remove(session)
            self.sessions.pop(session_id, None)
            self.metrics.sessions_open.set(len(self.sessions))

    async def close_all(self) -> None:
        for session_id in list(self.sessions):
            await self.close(session_id)

    def get(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            raise SessionError(404, f"unknown session {session_id!r} (closed, expired, or on another server)")
        session.last_used = time.monotonic()
        return session

    async def close_idle(self) -> int:
        """Close sessions unused for longer than the idle limit; returns how many."""
        limit = time.monotonic() - self.settings.session_idle_s
        idle = [s.session_id for s in self.sessions.values() if s.last_used < limit and not s.lock.locked()]
        for session_id in idle:
            await self.close(session_id)
        self.metrics.sessions_expired.inc(len(idle))
        return len(idle)

    # ------------------------------------------------------------------------------------ tools
    async def execute(self, session: Session, command: str, timeout_s: float | None = None) -> CommandResult:
        """Run a shell command in the workspace as the session's user."""
        limits = self._limits(session, timeout_s)
        async with session.lock, self._slots:
            session.commands += 1
            session.actions.append({"op": "exec", "command": command})
            result = await self._run(session, command, session.workspace, limits)
        self.metrics.observe_command("exec", result)
        return result

    async def run_tests(self, session: Session, hidden: bool = False) -> TestOutcome:
        """The task's visible tests in the workspace, or the hidden tests in a scratch copy of it."""
        task = session.task
        if not hidden:
            async with session.lock, self._slots:
                result = await self._run(session, task.test_command, session.workspace, session.limits)
            self.metrics.observe_command("tests", result)
            visible = [c for p, c in task.files.items() if p.rsplit("/", 1)[-1].startswith("test")]
            return summarize(result, count_test_methods(visible))
        scratch = session.home / "tmp" / f"score-{secrets.token_hex(4)}"
        async with session.lock, self._slots:
            shutil.copytree(session.workspace, scratch, symlinks=True)
            for path, content in task.hidden_tests.items():
                ws.write_text(scratch, path, content, session.owner)
            if session.owner:
                os.chown(scratch, *session.owner)
            try:
                if task.fail_to_pass:
                    # One run per list, each scored against its own ids: a crash fails every test of its run.
                    # The two lists are the hidden tests that count, so there is no third run of them all
                    # (every submit of every episode pays for each Python start-up).
                    fail_to_pass = await self._run_ids(session, task.fail_to_pass, scratch)
                    resolution = Resolution(fail_to_pass, await self._run_ids(session, task.pass_to_pass, scratch))
                    return resolution.combined()
                result = await self._unittest(session, task.hidden_test_modules, scratch)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
        return summarize(result, count_test_methods(list(task.hidden_tests.values())))

    async def _unittest(self, session: Session, names: list[str], cwd: Path) -> CommandResult:
        """`python -m unittest` of hidden test modules or test ids (validated dotted names) in `cwd`."""
        result = await self._run(session, f"python -m unittest -q {' '.join(names)}", cwd, session.limits)
        self.metrics.observe_command("hidden_tests", result)
        return result

    async def _run_ids(self, session: Session, ids: list[str] | None, cwd: Path) -> TestOutcome:
        if not ids:  # unittest without names would discover the visible tests instead
            return TestOutcome(total=0, passed=0, output="", exit_code=0, timed_out=False)
        return summarize(await self._unittest(session, ids, cwd), len(ids))

    def record(self, session: Session, action: dict[str, object]) -> None:
        session.actions.append(action)

    # -------------------------------------------------------------------------------- internals
    async def _run(self, session: Session, command: str, cwd: Path, limits: CommandLimits) -> CommandResult:
        result = await run_command(command, cwd=str(cwd), env=self._env(session), identity=session.identity,
                                   limits=limits)  # fmt: skip
        # Where a session lives on this server is no business of the agent's: paths in output are shown
        # relative to the workspace, so the same state gives the same observation on any server.
        return dataclasses.replace(result, output=result.output.replace(f"{cwd}/", "").replace(str(cwd), "."))

    def _new_session(self, task: Task, timeout_s: float | None) -> Session:
        if len(self.sessions) >= self.settings.max_sessions:
            raise SessionError(503, f"this server holds its maximum of {self.settings.max_sessions} sessions")
        session_id = secrets.token_hex(8)
        uid = self.settings.uid_base + next(self._uids) % self.settings.uid_span if self.isolated else os.geteuid()
        identity = Identity(uid=uid, gid=uid if self.isolated else os.getegid(), isolated=self.isolated)
        home = self.settings.root / session_id
        session = Session(session_id, task, identity, home, self.settings.limits)
        session.limits = self._limits(session, timeout_s)
        home.mkdir(mode=0o711)
        for sub, mode, owned in (("work", 0o700, True), ("tmp", 0o700, True), (HIDDEN_DIR, 0o700, False)):
            (home / sub).mkdir(mode=mode)
            if owned and session.owner:
                os.chown(home / sub, *session.owner)
        return session

    def _register(self, session: Session) -> None:
        self.sessions[session.session_id] = session
        self.metrics.sessions_open.set(len(self.sessions))
        self.metrics.sessions_created.inc()

    def _remove(self, session: Session) -> None:
        shutil.rmtree(session.home, ignore_errors=True)

    def _limits(self, session: Session, timeout_s: float | None) -> CommandLimits:
        if timeout_s is None:
            return session.limits
        if not 0 < timeout_s <= self.settings.max_timeout_s:
            raise SessionError(400, f"timeout must be in (0, {self.settings.max_timeout_s}] seconds, got {timeout_s}")
        return replace(session.limits, timeout_s=timeout_s)

    def _env(self, session: Session) -> dict[str, str]:
        # A clean environment: nothing of the server's (its token above all) reaches session commands.
        return {
            "PATH": f"{self._bin}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(session.workspace),
            "TMPDIR": str(session.home / "tmp"),
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
            "PYTHONHASHSEED": "0",
        }
