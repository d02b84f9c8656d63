"""The launch rule of the portable server (kuberl/portable_server.py), as the operator uses it: an init container
copies the bundle onto the shared mount, the task's image runs the bundled interpreter directly (no shell of the
image's), and the environment switches the server to image-workspace mode without touching the image's PATH."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from kuberl import portable_server
from kuberl.api import env_vars


def test_a_non_root_installer_fills_a_root_owned_mount_keeping_the_executables_modes(monkeypatch):
    work = Path(tempfile.mkdtemp(prefix="kuberl-install-", dir="/tmp"))  # reachable by the installer's uid
    try:
        _install_into(work, monkeypatch)
    finally:
        shutil.rmtree(work)


def _install_into(work: Path, monkeypatch) -> None:
    bundle, mount = work / "bundle", work / "mount"
    for part in portable_server.BUNDLE_PARTS:
        (bundle / part).mkdir(parents=True)
    (bundle / "bin" / "tool").write_text("#!/bin/sh\n")
    (bundle / "bin" / "tool").chmod(0o755)
    (bundle / "lib" / "libx.so").write_text("")
    mount.mkdir(mode=0o777)
    mount.chmod(0o777)  # a kubelet's emptyDir: root's, 0777
    work.chmod(0o755)
    monkeypatch.setattr(portable_server, "BUNDLE_IN_SANDBOX_IMAGE", str(bundle))
    monkeypatch.setattr(portable_server, "PORTABLE_MOUNT", str(mount))
    # as the operator's installer runs: a non-root uid (when this test runs as root)
    user = ["setpriv", "--reuid=65532", "--regid=65532", "--clear-groups"] if os.geteuid() == 0 else []
    subprocess.run([*user, *portable_server.install_argv()], check=True, capture_output=True)
    assert os.access(mount / "bin" / "tool", os.X_OK) and (mount / "bin" / "tool").stat().st_mode & 0o777 == 0o755
    assert (mount / "lib" / "libx.so").is_file() and (mount / "python").is_dir()
    assert mount.stat().st_mode & 0o777 == 0o777  # the mount's own folder untouched


def test_the_server_runs_the_bundled_interpreter_without_a_shell():
    argv = portable_server.server_argv(["--port", "8700"])
    assert argv[0].startswith(portable_server.PORTABLE_MOUNT + "/") and argv[0] != "/bin/sh"
    assert argv[-4:] == ["kuberl_app.cli", "sandbox", "--port", "8700"]


def test_the_environment_selects_image_workspace_mode_and_keeps_the_images_path():
    env = portable_server.server_env()
    assert env[env_vars.SANDBOX_FOREIGN_IMAGE] == "1"
    assert env["PYTHONHOME"].startswith(portable_server.PORTABLE_MOUNT + "/") and "PATH" not in env
    assert env["LD_PRELOAD"] == "" and env["LD_LIBRARY_PATH"] == ""
