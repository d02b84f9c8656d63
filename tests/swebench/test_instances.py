"""SWE-bench-format rows read as the datasets write them, their environment recipes, the Task each becomes, and
what a job on them refuses before it starts (fast: a small git repository made here, no pip)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from kuberl.api.environment import Task
from kuberl.api.spec import EnvironmentSpec
from kuberl.swebench.environments import EnvironmentProblem, python_for, recipe_for
from kuberl.swebench.instances import instance_task, read_instances
from kuberl.swebench.mirror import MirrorError, commit_tree, repository_path
from kuberl.swebench.readiness import readiness_problems, sandbox_environment
from kuberl_sandbox.repository import patched_files

TEST_PATCH = (
    "diff --git a/tests/test_a.py b/tests/test_a.py\nnew file mode 100644\n--- /dev/null\n+++ b/tests/test_a.py\n"
    "@@ -0,0 +1,2 @@\n+def test_a():\n+    assert True\n"
)


def row(**changes) -> dict:
    base = {
        "instance_id": "octo__lib-1",
        "repo": "octo/lib",
        "base_commit": "a" * 40,
        "patch": "",
        "test_patch": TEST_PATCH,
        "problem_statement": "lib.add(1, 2) returns -1",
        "FAIL_TO_PASS": ["tests/test_a.py::test_a"],
        "PASS_TO_PASS": [],
    }
    return {**base, **changes}


def write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_lists_and_json_encoded_strings_both_read_and_extra_keys_are_kept(tmp_path):
    file = write(
        tmp_path / "rows.jsonl",
        [
            row(),
            row(
                instance_id="octo__lib-2",
                FAIL_TO_PASS=json.dumps(["tests/test_a.py::test_a[x y]"]),
                PASS_TO_PASS="[]",
                version=1.3,
                docker_image="swebench/sweb.eval.x86_64.octo_1776_lib-2",
                environment_tag="py39",
            ),
        ],
    )
    instances, problems = read_instances(file)
    assert problems == []
    second = instances[1]
    assert second.fail_to_pass == ["tests/test_a.py::test_a[x y]"] and second.pass_to_pass == []
    assert second.version == "1.3"
    assert second.image == "swebench/sweb.eval.x86_64.octo_1776_lib-2"  # SWE-rebench's spelling of `image`
    assert second.extra_fields == {"environment_tag": "py39"}
    assert second.mirror_name == "octo__lib"


def test_a_row_that_cannot_be_used_gets_one_line_naming_the_instance_and_the_field(tmp_path):
    file = write(
        tmp_path / "rows.jsonl",
        [
            row(),
            row(instance_id="octo__lib-2", FAIL_TO_PASS="not json"),
            row(instance_id="octo__lib-3", base_commit="main"),
            "{broken",
            row(),
        ],
    )
    instances, problems = read_instances(file)
    assert [i.instance_id for i in instances] == ["octo__lib-1"]
    lines = [str(p) for p in problems]
    assert lines[0].startswith(f"{file} line 2: instance octo__lib-2: FAIL_TO_PASS: ")
    assert "expected a JSON list of test ids" in lines[0]
    assert lines[1].startswith(f"{file} line 3: instance octo__lib-3: base_commit: ")
    assert lines[2].startswith(f"{file} line 4: instance ?: (row): not valid JSON")
    assert lines[3] == f"{file} line 5: instance octo__lib-1: instance_id: duplicate, first on line 1"


def test_an_install_config_decides_the_recipe_and_equal_recipes_share_an_environment():
    from kuberl.api.swebench import SWEBenchInstance

    default = recipe_for(SWEBenchInstance.model_validate(row()))
    assert default.source == "default" and default.install == () and default.commit == "a" * 40
    configured = recipe_for(
        SWEBenchInstance.model_validate(
            row(
                environment_setup_commit="b" * 40,
                install_config={"python": 3.11, "pip_packages": "pytest==9.2.0 six", "install": "pip install -e ."},
            )
        )
    )
    assert configured.source == "install_config"
    assert (configured.python, configured.pip_packages, configured.install) == (
        "3.11",
        ("pytest==9.2.0", "six"),
        ("pip install -e .",),
    )
    assert configured.commit == "b" * 40
    other_instance = recipe_for(SWEBenchInstance.model_validate(row(instance_id="octo__lib-9")))
    assert other_instance.key == default.key != configured.key


def test_the_task_carries_the_test_patch_but_never_the_gold_patch():
    from kuberl.api.swebench import SWEBenchInstance

    instance = SWEBenchInstance.model_validate(row(patch="diff --git a/lib.py b/lib.py\n"))
    task = instance_task(instance)
    wire = json.dumps(task.to_manifest())
    assert "lib.py" not in wire and task.repository is not None
    assert task.repository.test_patch == TEST_PATCH and task.repository.test_files == ["tests/test_a.py"]
    assert "lib.add(1, 2) returns -1" in task.prompt
    assert Task.model_validate(task.to_manifest()) == task
    with pytest.raises(ValueError, match="a task on a repository takes its tests from it"):
        Task.model_validate({**task.to_manifest(), "files": {"a.py": ""}})


def test_patched_files_names_both_sides_of_a_diff():
    renamed = "--- a/old.py\n+++ b/new.py\n@@ -1 +1 @@\n-x\n+y\n"
    assert patched_files(TEST_PATCH + renamed) == ["tests/test_a.py", "old.py", "new.py"]


def test_a_python_this_machine_lacks_is_named():
    with pytest.raises(EnvironmentProblem, match=r"needs python2\.7, which this machine lacks"):
        python_for("2.7")


def _git_repository(folder: Path) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    folder.mkdir(parents=True)
    (folder / "lib.py").write_text("def add(a, b):\n    return a - b\n")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
        subprocess.run(["git", "-C", str(folder), *args], env=env, check=True, capture_output=True)
    return subprocess.run(
        ["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()


def test_the_mirror_gives_a_commit_tree_and_names_what_it_lacks(tmp_path):
    commit = _git_repository(tmp_path / "mirror" / "octo__lib")
    assert repository_path(tmp_path / "mirror", "octo/lib") == tmp_path / "mirror" / "octo__lib"
    tree = commit_tree(tmp_path / "mirror", tmp_path / "cache", "octo/lib", commit)
    assert tree.files == ("lib.py",) and tree.read("lib.py") == b"def add(a, b):\n    return a - b\n"
    assert tree.read_many(["lib.py", "nope.py"]) == {"lib.py": tree.read("lib.py"), "nope.py": None}
    with pytest.raises(MirrorError, match=r"repository 'octo/other' is not in the mirror .* octo__other/"):
        repository_path(tmp_path / "mirror", "octo/other")
    with pytest.raises(MirrorError, match="commit " + "c" * 40 + " is not in"):
        commit_tree(tmp_path / "mirror", tmp_path / "cache", "octo/lib", "c" * 40)


def test_a_job_refuses_to_start_without_its_commits_and_environments(tmp_path):
    commit = _git_repository(tmp_path / "mirror" / "octo__lib")
    file = write(tmp_path / "rows.jsonl", [row(base_commit=commit), row(instance_id="octo__lib-2")])
    env = EnvironmentSpec.model_validate(
        {
            "name": "swe-bench",
            "tasks": {"uri": str(file), "repos": str(tmp_path / "mirror"), "environments": str(tmp_path / "envs")},
        }
    )
    problems = readiness_problems(env)
    assert problems[0].startswith("instance octo__lib-1: environment ")
    assert f"not prepared in {tmp_path / 'envs'} (run `kuberl tasks prepare {file}" in problems[0]
    assert problems[1] == f"instance octo__lib-2: commit {'a' * 40} is not in {tmp_path / 'mirror' / 'octo__lib'}"
    assert sandbox_environment(env) == {
        "KUBERL_SANDBOX_REPOS": str(tmp_path / "mirror"),
        "KUBERL_SANDBOX_ENVIRONMENTS": str(tmp_path / "envs"),
    }
    assert readiness_problems(EnvironmentSpec()) == [] and sandbox_environment(EnvironmentSpec()) == {}


def test_on_one_machine_instances_need_the_mirror_even_when_they_name_images(tmp_path):
    file = write(tmp_path / "rows.jsonl", [row(image="reg/lib:1")])
    env = EnvironmentSpec.model_validate({"name": "swe-bench", "tasks": {"uri": str(file)}})
    (problem,) = readiness_problems(env)
    assert problem.startswith("spec.environment.tasks.repos: on one machine instances run from the mirror")


def test_a_mirror_on_s3_is_copied_once_and_read_like_a_folder(tmp_path, monkeypatch):
    """A real S3 API (moto's server on 127.0.0.1) holding a bare repository under a prefix."""
    import boto3
    from moto.server import ThreadedMotoServer

    from kuberl.swebench.readiness import download_mirror

    commit = _git_repository(tmp_path / "work" / "lib")
    bare = tmp_path / "bare" / "octo__lib.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(tmp_path / "work" / "lib"), str(bare)], check=True)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        for key, value in {
            "AWS_ENDPOINT_URL": f"http://{host}:{port}",
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1",
        }.items():
            monkeypatch.setenv(key, value)
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="datasets")
        for path in bare.rglob("*"):
            if path.is_file():
                s3.upload_file(str(path), "datasets", f"mirror/{path.relative_to(bare.parent)}")
        local = download_mirror("s3://datasets/mirror/", tmp_path / "cache")
        assert local == tmp_path / "cache" / "datasets" / "mirror"
        tree = commit_tree(local, tmp_path / "archives", "octo/lib", commit)
        assert tree.files == ("lib.py",)
        head = local / "octo__lib.git" / "HEAD"
        stamp = head.stat().st_mtime_ns
        download_mirror("s3://datasets/mirror/", tmp_path / "cache")  # unchanged objects are not fetched again
        assert head.stat().st_mtime_ns == stamp
        with pytest.raises(MirrorError, match="s3://nowhere/mirror: cannot download the mirror"):
            download_mirror("s3://nowhere/mirror", tmp_path / "cache")
    finally:
        server.stop()
