"""The one rule for tokens (`kuberl.tokens`): where a process finds its job token, how a token is written for
`kuberl run`, and the constant-time check every server makes."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from kuberl.api import env_vars
from kuberl.tokens import bearer, bearer_matches, read_job_token, write_token_file


def test_a_process_reads_the_mounted_file_before_the_value(tmp_path: Path):
    mounted = tmp_path / "token"
    mounted.write_text("from-the-secret\n")
    both = {env_vars.JOB_TOKEN_FILE: str(mounted), env_vars.JOB_TOKEN: "from-the-value"}
    assert read_job_token(both) == "from-the-secret"
    assert read_job_token({env_vars.JOB_TOKEN: "from-the-value"}) == "from-the-value"


@pytest.mark.parametrize(
    ("environ", "words"),
    [
        ({}, "set KUBERL_JOB_TOKEN_FILE"),
        ({env_vars.JOB_TOKEN: "  "}, "no job token"),
        ({env_vars.JOB_TOKEN_FILE: "/no/such/token"}, "cannot read"),
    ],
)
def test_a_missing_token_is_a_value_error_naming_what_to_set(environ, words):
    with pytest.raises(ValueError, match=words):
        read_job_token(environ)


def test_an_empty_token_file_is_refused(tmp_path: Path):
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        read_job_token({env_vars.JOB_TOKEN_FILE: str(tmp_path / "empty")})


def test_each_written_token_is_new_and_readable_by_its_owner_only(tmp_path: Path):
    path = tmp_path / "run" / "job-token"
    first = write_token_file(path)
    path.chmod(0o644)  # a file left behind with a wider mode is replaced, not reused
    second = write_token_file(path)
    assert first != second and len(second) >= 40
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_job_token({env_vars.JOB_TOKEN_FILE: str(path)}) == second


@pytest.mark.parametrize(
    ("header", "matches"),
    [
        ("Bearer s3cr3t", True),
        ("bearer s3cr3t", True),
        ("Bearer s3cr3t-and-more", False),
        ("Bearer s3cr", False),
        ("s3cr3t", False),
        ("Basic s3cr3t", False),
        ("Bearer ", False),
        ("", False),
        (None, False),
        ("Bearer séсret", False),  # not ASCII: refused, not a 500
    ],
)
def test_a_header_matches_only_the_exact_bearer_token(header, matches):
    assert bearer_matches(header, "s3cr3t") is matches
    assert bearer_matches(header, b"s3cr3t") is matches


def test_no_header_matches_an_empty_token():
    assert not bearer_matches("Bearer ", "") and not bearer_matches(bearer("")["Authorization"], b"")
