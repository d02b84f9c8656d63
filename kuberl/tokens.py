"""Bearer tokens of KubeRL's servers: where a process finds its job's token, how a caller presents a token and
how a server checks one.

Two tokens guard a job. The sandbox token (`KUBERL_SANDBOX_TOKEN`) lets rollout servers call sandboxes; the job
token lets the learner, `kuberl run` and the job's owner call rollout servers. Pods read the job token from a
mounted Secret file (`KUBERL_JOB_TOKEN_FILE`); `KUBERL_JOB_TOKEN` holds the value itself, for processes started
by hand. Sandbox pods never get the job token: untrusted code runs there.
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from kuberl.api import env_vars

CHALLENGE = {"WWW-Authenticate": "Bearer"}
"""The header a 401 answers with (RFC 6750)."""


class MissingToken(ValueError):
    """No token, or one that cannot be read; the message says what to set."""


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def read_job_token(environ: Mapping[str, str] | None = None) -> str:
    """The job token: the file `KUBERL_JOB_TOKEN_FILE` names when it is set, else `KUBERL_JOB_TOKEN`."""
    environ = os.environ if environ is None else environ
    path = environ.get(env_vars.JOB_TOKEN_FILE)
    if path:
        try:
            token = Path(path).read_text().strip()
        except OSError as err:
            raise MissingToken(
                f"{env_vars.JOB_TOKEN_FILE}={path}: cannot read the job token ({err.strerror})"
            ) from None
        if not token:
            raise MissingToken(f"{env_vars.JOB_TOKEN_FILE}={path}: the file is empty")
        return token
    token = environ.get(env_vars.JOB_TOKEN, "").strip()
    if not token:
        raise MissingToken(
            f"no job token: set {env_vars.JOB_TOKEN_FILE} (a file holding it) or {env_vars.JOB_TOKEN}; "
            "callers send it as 'Authorization: Bearer <token>'"
        )
    return token


def bearer(token: str) -> dict[str, str]:
    """The header that presents `token`."""
    return {"Authorization": f"Bearer {token}"}


def bearer_matches(authorization: str | None, token: str | bytes) -> bool:
    """Whether an `Authorization` header presents `token` (compared in constant time); never for an empty one."""
    expected = token.encode() if isinstance(token, str) else token
    scheme, _, presented = (authorization or "").partition(" ")
    return bool(expected) and scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), expected)


def write_token_file(path: Path) -> str:
    """A fresh token written to `path` (replacing what was there), readable by its owner only; returns it."""
    token = new_token()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)  # a file left by an earlier run keeps its mode: start from none
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    return token
