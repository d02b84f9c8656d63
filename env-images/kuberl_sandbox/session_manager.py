"""Sessions: one isolated workspace and user per agent episode, with the tools the agent uses.

A session is created from a task (or from a snapshot taken on any server), runs one command at a time,
and keeps the log of its mutating actions so its state can be explained and rebuilt.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from kuberl import portable_server
from kuberl.api import env_vars
from kuberl.api.environment import Snapshot, Task
from kuberl.api.tampering import TamperingReason
from kuberl.errors import ServiceError
from kuberl.swebench import pytest_report
from kuberl_sandbox import hardened, image_workspace, installation, oracle, repository, snapshots, uids
from kuberl_sandbox import workspace as ws
from kuberl_sandbox.execution import (
    SHARED_SCRATCH,
    CommandResult,
    Identity,
    fstab_of,
    make_private_root,
    namespaces_available,
    run_command,
)
from kuberl_sandbox.metrics import SandboxMetrics
from kuberl_sandbox.outcome_cache import OutcomeCache, task_digest
from kuberl_sandbox.programs import PATCH, RM
from kuberl_sandbox.rights import Owner, drop_supplementary_groups, session_rights
from kuberl_sandbox.session_network import SLIRP_DNS, NetworkUnavailable, SessionNetwork, host_addresses
from kuberl_sandbox.settings import CommandLimits, SandboxSettings
from kuberl_sandbox.testrun import Resolution, TestOutcome, count_test_methods, new_nonce, split_report

HIDDEN_DIR = "hidden"
REPOSITORY_TEST_OUTPUT = 4 << 20
"""Output a repository's test run may print before it is killed (its report comes last)."""
PRIVATE_DIR = "private"  # the session's 0700: its own /tmp, /var/tmp, /dev/shm and /run/lock (isolated only)
T = TypeVar("T")
log = logging.getLogger("kuberl.sandbox")


def isolation_problem(settings: SandboxSettings, why: str | None) -> str | None:
    """Why this server must not start (one line): a task's own image that lacks what sessions need, or sessions
    that cannot be isolated when that was not allowed."""
    if settings.foreign_image and (problem := foreign_image_problem()):
        return problem
    if why is None or settings.allow_shared_user:
        return None
    return (
        f"sandbox: cannot isolate sessions: {' '.join(why.split())}. Sessions need unprivileged user namespaces "
        "(user.max_user_namespaces > 0; no seccomp or AppArmor profile denying unshare or mount) and a root "
        "server with CAP_SETUID and CAP_SETGID; refusing to run agent code unisolated "
        "(development only: KUBERL_SANDBOX_ALLOW_SHARED_USER=1)."
    )


def foreign_image_problem() -> str | None:
    """What a task's own image lacks that the portable server needs (one line naming it and what to do), or None."""
    return image_workspace.bundle_problem() or image_workspace.shell_problem()


TERMINATION_LOG = Path("/dev/termination-log")
"""Where Kubernetes reads a container's last words (terminationMessagePath): the operator shows them in the job's
status."""


def report_start_failure(problem: str, termination_log: Path = TERMINATION_LOG) -> None:
    """Say why the server does not start: one line on stderr, and in the termination log where the kubelet
    made one (never a new file elsewhere)."""
    print(problem, file=sys.stderr, flush=True)
    if termination_log.is_file():
        with contextlib.suppress(OSError):
            termination_log.write_text(problem)


def _module_of(path: str) -> str:
    """The module name of a test file: `sub/test_x.py` -> `sub.test_x`."""
    return path.removesuffix(".py").replace("/", ".")


def _unscorable(task: Task, hidden: bool, why: str) -> TestOutcome:
    """The outcome of a run that could not happen: nothing passed (and, for a submission, not resolved)."""
    failed = TestOutcome(total=0, passed=0, output=why, exit_code=None, timed_out=False)
    repo = task.repository
    fail_to_pass, pass_to_pass = (
        (repo.fail_to_pass, repo.pass_to_pass) if repo else (task.fail_to_pass, task.pass_to_pass)
    )
    if not (hidden and fail_to_pass):
        return failed
    parts = [
        TestOutcome(
            total=len(ids), passed=0, output=why if ids is fail_to_pass else "", exit_code=None, timed_out=False
        )
        for ids in (fail_to_pass, pass_to_pass or [])
    ]
    return Resolution(*parts).combined()


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
    checkout: repository.Checkout | None = None
    """Tasks on a repository: the base commit's tree and the prepared environment."""
    network: SessionNetwork | None = None
    """Isolated only: the processes holding the session's user and network namespaces."""

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
        self._uid_block: uids.UidBlock | None = None  # claimed by prepare(), isolated only
        self._slots = asyncio.Semaphore(settings.max_concurrent_commands)
        self.outcomes = OutcomeCache(settings.test_outcomes_kept)
        self._running: dict[tuple[str, bool, str], asyncio.Future[TestOutcome | None]] = {}
        """Test runs under way by key: a run with the same key waits for their outcome instead of starting."""
        self._bin = settings.root / ".bin"
        self._covers: dict[tuple[Path, ...], tuple[Path, ...]] = {}
        """The folders sessions do not see, by the shared folders they need (found once: a walk per session open
        would cost more than the rest of it)."""
        self._blocked: list[str] = []
        """Egress allowed: the host's own addresses, which sessions must not reach (read once, at start)."""

    # ------------------------------------------------------------------------------ lifecycle
    def prepare(self) -> None:
        """Create the root folder (reachable, not listable, by session users) and the `python` shim."""
        root = self.settings.root
        if os.geteuid() == 0:
            # Claimed before the probe, so that even the probe runs as a uid no other server on this host hands out.
            # Held while the process lives: the kernel frees it however the process ends.
            # In a user namespace (a `hostUsers: false` pod) the blocks are fitted into the ids it maps.
            settings = self.settings
            base, size, count = uids.mapped_blocks(settings.uid_base, settings.uid_block_size, settings.uid_blocks)
            if size <= settings.max_sessions or count == 0:
                raise RuntimeError(
                    f"the uid block ({size} ids from {base}, of this process's uid map) must hold "
                    f"more than max_sessions ({settings.max_sessions}) sessions"
                )
            self._uid_block = uids.claim_block(base, size, count)
            # The file tools switch their thread's file uid and gid to the session's; the supplementary groups
            # are the process's and are not switched, so root drops its own (it needs none).
            drop_supplementary_groups()
        why = namespaces_available(self._uid_block.first if self._uid_block else self.settings.uid_base)
        self.isolated = why is None
        if not self.isolated and self._uid_block:
            self._uid_block.release()
            self._uid_block = None
        if problem := isolation_problem(self.settings, why):
            raise RuntimeError(problem)
        if not self.isolated:
            log.warning("sandbox is NOT isolated (%s): sessions share one user and network; development only", why)
        elif not self.settings.network_namespace:
            log.warning(
                "sessions share the server's network (%s=0): measurements only", env_vars.SANDBOX_NETWORK_NAMESPACE
            )
        self._blocked = host_addresses() if self.settings.egress else []
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
        await self._open_network(session)
        try:
            if session.checkout is not None:
                await asyncio.to_thread(repository.fill_workspace, session.checkout, session.workspace, session.owner)
            await asyncio.to_thread(self._write_task_files, session, task.files)
            await asyncio.to_thread(self._write_hidden_tests, session, session.home / HIDDEN_DIR, None)
        except (ws.WorkspaceError, OSError) as err:
            await asyncio.to_thread(self._remove, session)
            raise SessionError(400, str(err)) from None
        self._register(session)
        return session

    async def restore(self, task: Task, snapshot: Snapshot) -> Session:
        """A new session rebuilt from a snapshot sealed by a server of this job; its checksum must match."""
        if snapshot.task_id != task.task_id:
            raise SessionError(400, f"the snapshot is of task {snapshot.task_id!r}, not {task.task_id!r}")
        if not snapshots.is_sealed(
            self._snapshot_key, snapshot.task_id, snapshot.checksum, snapshot.data, snapshot.mac
        ):
            raise SessionError(403, "the snapshot's MAC does not match: only this job's sandbox servers make snapshots")
        session = self._new_session(task, None)
        await self._open_network(session)
        try:
            # archives can be large: unpack off the event loop so other sessions keep being served
            await asyncio.to_thread(
                snapshots.extract,
                snapshot.data,
                session.workspace,
                session.owner,
                self.settings.max_body_bytes * 8,
                self.settings.limits.max_file_bytes,
            )
            await asyncio.to_thread(self._write_hidden_tests, session, session.home / HIDDEN_DIR, None)
            actual = await asyncio.to_thread(ws.checksum, session.workspace, session.owner)
        except ws.WorkspaceError as err:
            await asyncio.to_thread(self._remove, session)
            raise SessionError(400, str(err)) from None
        if actual != snapshot.checksum:
            await asyncio.to_thread(self._remove, session)
            raise SessionError(409, f"restored workspace checksum {actual[:12]} != snapshot {snapshot.checksum[:12]}")
        session.actions = list(snapshot.actions)
        self._register(session)
        return session

    async def _open_network(self, session: Session) -> None:
        """Start the holder of the session's user and network namespaces (isolated only); 503 if it cannot be."""
        identity, settings = session.identity, self.settings
        if not identity.isolated or identity.private is None:
            return
        try:
            session.network = await asyncio.to_thread(
                SessionNetwork.open,
                identity.uid,
                identity.gid,
                settings.limits.max_processes,
                fstab_of(identity.private),
                settings.egress,
                self._blocked,
                settings.network_namespace,
            )
        except (NetworkUnavailable, OSError) as err:
            await asyncio.to_thread(self._remove, session)
            raise SessionError(503, f"the session's network could not be made: {err}") from None
        session.identity = replace(identity, namespaces=session.network.pid, own_network=session.network.network)

    async def snapshot(self, session: Session) -> Snapshot:
        """The session's workspace, archived and sealed (under its lock: no command changes it meanwhile)."""
        async with session.lock:
            checksum = await self.file_op(ws.checksum, session.workspace, session.owner)
            data = await self.file_op(snapshots.archive, session.workspace, session.owner, self._max_file_bytes)
        task_id = session.task.task_id
        return Snapshot(
            session_id=session.session_id,
            task_id=task_id,
            checksum=checksum,
            data=data,
            mac=snapshots.seal(self._snapshot_key, task_id, checksum, data),
            actions=list(session.actions),
        )

    # ------------------------------------------------------------------------------ file tools
    async def read_file(self, session: Session, path: str, limit: int) -> tuple[str, bool]:
        async with session.lock:
            return await self.file_op(ws.read_text, session.workspace, path, limit, session.owner)

    async def write_file(self, session: Session, path: str, content: str) -> int:
        async with session.lock:
            size = await self.file_op(
                ws.write_text, session.workspace, path, content, session.owner, self._max_file_bytes
            )
            session.actions.append({"op": "write", "path": path, "content": content})
        return size

    async def replace(self, session: Session, path: str, old: str, new: str) -> int:
        async with session.lock:
            count = await self.file_op(
                ws.replace_text, session.workspace, path, old, new, session.owner, self._max_file_bytes
            )
            session.actions.append({"op": "replace", "path": path, "old": old, "new": new})
        return count

    async def apply_patch(self, session: Session, patch: str) -> CommandResult:
        """Apply a unified diff (-p1) with `patch`, run as the session's user: it can change nothing that user
        could not. The diff goes in through a file the session owns, written with its rights, then removed."""
        name = f"patch-{secrets.token_hex(8)}.diff"
        folder = session.home / "tmp"
        async with session.lock:
            await self.file_op(ws.write_text, folder, name, patch, session.owner, self._max_file_bytes)
        try:
            return await self.execute(
                session, f"{PATCH} -p1 --batch --forward --no-backup-if-mismatch -i {folder / name}"
            )
        finally:
            async with session.lock:
                await self.file_op(self._remove_file_as, folder / name, session.owner)

    async def list_files(self, session: Session, path: str) -> list[dict[str, object]]:
        async with session.lock:
            return await self.file_op(ws.list_dir, session.workspace, path, session.owner)

    async def search(self, session: Session, text: str, path: str, max_matches: int) -> tuple[list, bool]:
        async with session.lock:
            return await self.file_op(
                ws.search_text, session.workspace, path, text, session.owner, max_matches, self._max_file_bytes
            )

    async def checksum(self, session: Session) -> str:
        async with session.lock:
            return await self.file_op(ws.checksum, session.workspace, session.owner)

    async def file_op(self, operation: Callable[..., T], *args: object) -> T:
        """Run one file operation off the event loop (a slow disk or a huge file stalls no other session).
        Callers hold the session's lock, so no command of the session runs meanwhile."""
        return await asyncio.to_thread(operation, *args)

    def record(self, session: Session, action: dict[str, object]) -> None:
        session.actions.append(action)

    @property
    def _snapshot_key(self) -> bytes:
        return snapshots.snapshot_key(self.settings.token)

    @property
    def _max_file_bytes(self) -> int:
        return self.settings.limits.max_file_bytes

    def _write_task_files(self, session: Session, files: dict[str, str]) -> None:
        for path, content in files.items():
            ws.write_text(session.workspace, path, content, session.owner, self._max_file_bytes)

    def _write_hidden_tests(self, session: Session, folder: Path, owner: Owner | None) -> None:
        self._write_files(folder, session.task.hidden_tests, owner)

    def _write_files(self, folder: Path, files: dict[str, str], owner: Owner | None) -> None:
        for path, content in files.items():
            ws.write_text(folder, path, content, owner, self._max_file_bytes)

    async def close(self, session_id: str) -> None:
        session = self.get(session_id)
        async with session.lock:
            await asyncio.to_thread(self._remove, session)
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
        """The task's visible tests (`run_tests`), or its hidden ones (the submission's score), in a scratch
        copy of the workspace made as the session's user. Tasks with an oracle are scored by it; the rest by a
        hardened unittest run on pristine copies of the test files (see oracle.py and hardened.py)."""
        async with session.lock:
            key = await self._outcome_key(session, hidden)
            outcome = await self._reused(key, hidden) or await self._test_shared(session, hidden, key)
        if outcome.tampering is not None:
            self.metrics.observe_tampering(outcome.tampering.value)
            log.warning("session %s: test report not trusted (%s)", session.session_id, outcome.tampering.value)
        return outcome

    async def _outcome_key(self, session: Session, hidden: bool) -> tuple[str, bool, str] | None:
        """What decides this test run's outcome (outcome_cache.py); None when the workspace cannot be read."""
        if self.outcomes.entries <= 0:
            return None
        try:
            content = await self.file_op(ws.checksum, session.workspace, session.owner)
        except ws.WorkspaceError:
            return None
        return task_digest(session.task), hidden, content

    async def _reused(self, key: tuple[str, bool, str] | None, hidden: bool) -> TestOutcome | None:
        """The outcome of an earlier run with `key`, or of the one running now (the episodes of a group test the
        untouched files at the same moment); None when there is none and this run must run the tests."""
        if key is None:
            return None
        outcome = self.outcomes.get(*key)
        if outcome is None and key in self._running:
            outcome = await asyncio.shield(self._running[key])
        if outcome is not None:
            self.metrics.observe_cached_test_run("hidden_tests" if hidden else "tests")
        return outcome

    async def _test_shared(self, session: Session, hidden: bool, key: tuple[str, bool, str] | None) -> TestOutcome:
        """Run the tests; with a key, runs with the same key that come meanwhile wait for this outcome."""
        if key is None:
            async with self._slots:
                return await self._test(session, hidden)
        running = self._running[key] = asyncio.get_running_loop().create_future()
        outcome = None
        try:
            async with self._slots:
                outcome = await self._test(session, hidden)
            self.outcomes.put(*key, outcome)
            return outcome
        finally:
            if self._running.get(key) is running:
                del self._running[key]
            running.set_result(outcome)  # None when this run was cancelled: the waiters run the tests themselves

    async def _test(self, session: Session, hidden: bool) -> TestOutcome:
        task = session.task
        scratch = session.home / "tmp" / f"score-{secrets.token_hex(4)}"
        try:
            await self.file_op(
                snapshots.copy_workspace, session.workspace, scratch, session.owner, self._max_file_bytes
            )
            if task.oracle is not None:
                return await self._oracle_run(session, scratch, hidden)
            if session.checkout is not None:
                return await self._repository_run(session, scratch, hidden)
            return await self._hardened_run(session, scratch, hidden)
        except ws.WorkspaceError as err:
            # the agent made its workspace unscorable (an unreadable file, a folder where a test file goes):
            # every test fails, and a submission still gets its verdict
            return _unscorable(task, hidden, f"error: the workspace cannot be tested: {err}")
        finally:
            await self.file_op(self._remove_as, scratch, session.owner)

    async def _oracle_run(self, session: Session, scratch: Path, hidden: bool) -> TestOutcome:
        task, nonce = session.task, new_nonce()
        assert task.oracle is not None
        checks = task.oracle.hidden if hidden else task.oracle.visible
        if not checks:
            return TestOutcome(total=0, passed=0, output="no tests to run", exit_code=0, timed_out=False)
        result = await self._run(session, oracle.command(checks, str(scratch), nonce), scratch, session.limits)
        self.metrics.observe_command("hidden_tests" if hidden else "tests", result)
        if hidden and task.fail_to_pass:
            return oracle.resolution(checks, result, nonce, task.fail_to_pass, task.pass_to_pass or [])
        return oracle.outcome(checks, result, nonce)

    async def _repository_run(self, session: Session, scratch: Path, hidden: bool) -> TestOutcome:
        """A task on a repository: pytest on a scratch copy, SWE-bench's verdict for a submission (repository.py)."""
        task, checkout, nonce = session.task.repository, session.checkout, new_nonce()
        assert task is not None and checkout is not None
        limits = replace(session.limits, output_bytes=max(session.limits.output_bytes, REPOSITORY_TEST_OUTPUT))
        if hidden:
            await self.file_op(repository.prepare_scratch, scratch, task, checkout, session.owner, self._max_file_bytes)
            applied = await self._apply_test_patch(session, scratch, task.test_patch)
            if applied.exit_code != 0:
                return _unscorable(session.task, True, f"error: the test patch does not apply:\n{applied.output}")
            files = task.test_files
        else:
            await self.file_op(repository.clean_for_visible_run, scratch, checkout, session.owner, self._max_file_bytes)
            files = [f for f in task.test_files if f in checkout.tree.files]
        command = pytest_report.command(str(scratch), files, nonce, checkout.source_paths, checkout.python)
        result = await self._run(session, command, scratch, limits, test_run=True)
        self.metrics.observe_command("hidden_tests" if hidden else "tests", result)
        report = split_report(result, nonce)
        outcomes: dict[str, str] = {}
        tampering = report.tampering
        if report.payload is not None:
            try:
                outcomes = pytest_report.parse(report.payload)[1]
            except ValueError:
                tampering = TamperingReason.MALFORMED_REPORT
        if tampering is not None:
            outcomes = {}
        text = report.output + (
            f"\nERROR: the test report could not be trusted ({tampering.value})" if tampering else ""
        )

        def counted(ids: list[str], output: str) -> TestOutcome:
            passed = sum(pytest_report.passed(outcomes, i) for i in ids)
            return TestOutcome(len(ids), passed, output, result.exit_code, result.timed_out, tampering=tampering)

        if not hidden:
            return counted(list(outcomes), text)
        return Resolution(counted(task.fail_to_pass, text), counted(task.pass_to_pass, "")).combined()

    async def _apply_test_patch(self, session: Session, scratch: Path, patch: str) -> CommandResult:
        """`git apply`, or `patch` with some fuzz where git refuses (as SWE-bench's harness does), as the session."""
        name = f"test-{secrets.token_hex(8)}.diff"
        folder = scratch.parent
        await self.file_op(ws.write_text, folder, name, patch, session.owner, max(self._max_file_bytes, len(patch) + 1))
        path = shlex.quote(str(folder / name))
        command = (
            f"git apply --whitespace=nowarn {path} 2>/dev/null || "
            f"{PATCH} --batch --fuzz=5 -p1 --no-backup-if-mismatch -i {path}"
        )
        try:
            return await self._run(session, command, scratch, session.limits)
        finally:
            await self.file_op(self._remove_file_as, folder / name, session.owner)

    async def _hardened_run(self, session: Session, scratch: Path, hidden: bool) -> TestOutcome:
        task, nonce = session.task, new_nonce()
        visible = {p: c for p, c in task.files.items() if p.rsplit("/", 1)[-1].startswith("test")}
        own = [p.removesuffix(".py").split("/")[0] for p in task.files if p not in visible]
        tests = [_module_of(p) for p in [*visible, *task.hidden_tests]]
        await self.file_op(hardened.clean, scratch, tests, own)
        await self.file_op(self._write_files, scratch, visible, session.owner)
        if not hidden:
            result = await self._run(
                session,
                hardened.command([_module_of(p) for p in visible], str(scratch), nonce),
                scratch,
                session.limits,
                test_run=True,
            )
            self.metrics.observe_command("tests", result)
            return hardened.outcome(result, nonce, None, count_test_methods(list(visible.values())))
        await self.file_op(self._write_files, scratch, task.hidden_tests, session.owner)
        if task.fail_to_pass:
            ids = [*task.fail_to_pass, *(task.pass_to_pass or [])]
            result = await self._run(
                session, hardened.command(ids, str(scratch), nonce), scratch, session.limits, test_run=True
            )
            self.metrics.observe_command("hidden_tests", result)
            parts = [hardened.outcome(result, nonce, list(i), 0) for i in (task.fail_to_pass, task.pass_to_pass or [])]
            return Resolution(*parts).combined()
        names = task.hidden_test_modules
        result = await self._run(
            session, hardened.command(names, str(scratch), nonce), scratch, session.limits, test_run=True
        )
        self.metrics.observe_command("hidden_tests", result)
        return hardened.outcome(result, nonce, None, count_test_methods(list(task.hidden_tests.values())))

    # -------------------------------------------------------------------------------- internals
    async def _run(
        self, session: Session, command: str, cwd: Path, limits: CommandLimits, test_run: bool = False
    ) -> CommandResult:
        env = self._env(session)
        if test_run:  # a test run: HOME is not the workspace (no user site, no dotfiles of the agent's)
            env["HOME"] = str(cwd.parent)
        result = await run_command(command, cwd=str(cwd), env=env, identity=session.identity, limits=limits)
        # Where a session lives on this server is no business of the agent's: paths in output are shown
        # relative to the workspace, so the same state gives the same observation on any server.
        return dataclasses.replace(result, output=result.output.replace(f"{cwd}/", "").replace(str(cwd), "."))

    def _new_session(self, task: Task, timeout_s: float | None) -> Session:
        if len(self.sessions) >= self.settings.max_sessions:
            raise SessionError(503, f"this server holds its maximum of {self.settings.max_sessions} sessions")
        try:
            checkout = repository.checkout_for(self.settings, task.repository) if task.repository else None
        except repository.RepositoryUnavailable as err:
            raise SessionError(409, f"task {task.task_id}: {err}") from None
        session_id = secrets.token_hex(8)
        home = self.settings.root / session_id
        if self.isolated and self._uid_block:
            # uids of this server's own block; after a wrap, skip any a long-lived session still has
            taken = {s.identity.uid for s in self.sessions.values()}
            uid = next(u for u in map(self._uid_block.uid, self._uids) if u not in taken)
            identity = Identity(uid=uid, gid=uid, isolated=True, private=(home / PRIVATE_DIR).absolute())
        else:
            identity = Identity(uid=os.geteuid(), gid=os.getegid(), isolated=False)
        session = Session(session_id, task, identity, home, self.settings.limits, checkout=checkout)
        session.limits = self._limits(session, timeout_s)
        home.mkdir(mode=0o711)
        for sub, mode, owned in (("work", 0o700, True), ("tmp", 0o700, True), (HIDDEN_DIR, 0o700, False)):
            (home / sub).mkdir(mode=mode)
            if owned and session.owner:
                os.chown(home / sub, *session.owner)
        if identity.private:
            shared = checkout.shared if checkout is not None else ()
            if shared not in self._covers:
                self._covers[shared] = tuple(self._hidden_folders(shared))
            hidden = self._covers[shared]
            owner, resolver = (identity.uid, identity.gid), SLIRP_DNS if self.settings.egress else None
            make_private_root(identity.private, self.settings.root, shared, hidden, owner, resolver)
        return session

    def _hidden_folders(self, shared: tuple[Path, ...]) -> list[Path]:
        """The server's installation and the job's task store, but what sessions need (installation.py)."""
        settings = self.settings
        keep = [settings.root, Path(settings.python), *shared]
        keep += [settings.environments] if settings.environments is not None else []
        # the mirror's history holds the fixes (the server unpacks each base commit itself): out of sight too
        roots = [*installation.installation_folders(), *settings.hidden]
        # the portable bundle's interpreter and packages; its tools stay, commands run some of them (programs.py)
        roots += [Path(portable_server.PYTHON_HOME)] if settings.foreign_image else []
        roots += [settings.repos] if settings.repos is not None else []
        return installation.folders_to_cover(roots, keep, invisible=[Path(p) for p in SHARED_SCRATCH])

    def _register(self, session: Session) -> None:
        self.sessions[session.session_id] = session
        self.metrics.sessions_open.set(len(self.sessions))
        self.metrics.sessions_created.inc()

    def _remove(self, session: Session) -> None:
        """End the session's namespaces, then delete its folder. As root (the session's user may have made
        folders it cannot enter), by GNU `rm`, which walks by descriptors without following links, stays on this
        file system, and, unlike `shutil.rmtree`, has no recursion limit (a command can nest thousands of
        folders)."""
        if session.network is not None:
            session.network.close()
        subprocess.run([RM, "-rf", "--one-file-system", "--", str(session.home)], capture_output=True, check=False)

    @staticmethod
    def _remove_file_as(path: Path, owner: Owner | None) -> None:
        with session_rights(owner), contextlib.suppress(OSError):
            os.unlink(path)

    @staticmethod
    def _remove_as(folder: Path, owner: Owner | None) -> None:
        with session_rights(owner):  # the copy is at most MAX_DEPTH deep: rmtree's recursion holds
            shutil.rmtree(folder, ignore_errors=True)

    def _limits(self, session: Session, timeout_s: float | None) -> CommandLimits:
        if timeout_s is None:
            return session.limits
        if not 0 < timeout_s <= self.settings.max_timeout_s:
            raise SessionError(400, f"timeout must be in (0, {self.settings.max_timeout_s}] seconds, got {timeout_s}")
        return replace(session.limits, timeout_s=timeout_s)

    def _env(self, session: Session) -> dict[str, str]:
        # A clean environment: nothing of the server's (its token above all) reaches session commands.
        # A task on a repository runs in its prepared venv, the workspace's code first on the import path.
        # In a task's own image, its PATH as the image sets it: the image's Python and tools.
        checkout = session.checkout
        venv = {} if checkout is None else self._venv_env(checkout, session.workspace)
        if self.settings.foreign_image:
            path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
        else:
            prepared = f"{checkout.environment.bin}:" if checkout and checkout.environment else ""
            path = f"{prepared}{self._bin}:/usr/local/bin:/usr/bin:/bin"
        return venv | {
            "PATH": path,
            "HOME": str(session.workspace),
            # isolated: the session's own /tmp (mounted for each command); else the session's tmp/ folder
            "TMPDIR": "/tmp" if session.identity.isolated else str(session.home / "tmp"),
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
            "PYTHONHASHSEED": "0",
        }

    @staticmethod
    def _venv_env(checkout: repository.Checkout, workspace: Path) -> dict[str, str]:
        paths = [str(workspace) if p == "." else str(workspace / p) for p in checkout.source_paths]
        venv = {"VIRTUAL_ENV": str(checkout.environment.folder / "venv")} if checkout.environment else {}
        return venv | {"PYTHONPATH": ":".join(paths)}
