"""The launch rule of the portable server (kuberl/portable_server.py), as the operator uses it: an init container
copies the bundle onto the shared mount, the task's image runs the bundled interpreter directly (no shell of the
image's), and the environment switches the server to image-workspace mode without touching the image's PATH."""

from __future__ import annotations

from kuberl import portable_server
from kuberl.api import env_vars


def test_the_init_container_copies_the_bundle_onto_the_shared_mount():
    argv = portable_server.install_argv()
    assert argv[0] == "cp" and argv[-2:] == [portable_server.BUNDLE_IN_SANDBOX_IMAGE, portable_server.PORTABLE_MOUNT]


def test_the_server_runs_the_bundled_interpreter_without_a_shell():
    argv = portable_server.server_argv(["--port", "8700"])
    assert argv[0].startswith(portable_server.PORTABLE_MOUNT + "/") and argv[0] != "/bin/sh"
    assert argv[-4:] == ["kuberl.cli", "sandbox", "--port", "8700"]


def test_the_environment_selects_image_workspace_mode_and_keeps_the_images_path():
    env = portable_server.server_env()
    assert env[env_vars.SANDBOX_FOREIGN_IMAGE] == "1"
    assert env["PYTHONHOME"].startswith(portable_server.PORTABLE_MOUNT + "/") and "PATH" not in env
    assert env["LD_PRELOAD"] == "" and env["LD_LIBRARY_PATH"] == ""
