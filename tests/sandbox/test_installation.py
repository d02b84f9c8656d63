"""Which folders a session's mount namespace covers: the server's installation and the job's task store, but
never what sessions need (the sandbox root, an environment, the interpreter) nor the system they run on."""

from __future__ import annotations

from pathlib import Path

from kuberl_sandbox.installation import folders_to_cover, installation_folders


def tree(base: Path, *folders: str) -> None:
    for folder in folders:
        (base / folder).mkdir(parents=True)


def test_a_root_is_covered_whole_when_nothing_in_it_is_needed(tmp_path):
    tree(tmp_path, "checkout/kuberl/suites", "checkout/.git/objects")
    assert folders_to_cover([tmp_path / "checkout"], keep=[tmp_path / "elsewhere"]) == [tmp_path / "checkout"]


def test_what_sessions_need_stays_and_its_siblings_are_covered(tmp_path):
    tree(tmp_path, "checkout/kuberl", "checkout/.git", "checkout/runs/sandbox/s1", "checkout/runs/swe-toy")
    (tmp_path / "checkout/README.md").write_text("files beside stay: only folders are covered\n")
    covers = folders_to_cover([tmp_path / "checkout"], keep=[tmp_path / "checkout/runs/sandbox"])
    assert covers == sorted(tmp_path / "checkout" / p for p in (".git", "kuberl", "runs/swe-toy"))


def test_a_link_that_is_kept_keeps_both_its_name_and_its_target(tmp_path):
    tree(tmp_path, "checkout/.venv/bin", "checkout/.venv/lib", "real/bin")
    (tmp_path / "real/bin/python3").write_text("")
    (tmp_path / "checkout/.venv/bin/python").symlink_to(tmp_path / "real/bin/python3")
    covers = folders_to_cover([tmp_path / "checkout", tmp_path / "real"], keep=[tmp_path / "checkout/.venv/bin/python"])
    assert covers == [tmp_path / "checkout/.venv/lib"]


def test_roots_out_of_sight_anyway_inside_others_or_above_the_system_are_not_covered(tmp_path):
    tree(tmp_path, "scratch/checkout", "store/inner")
    roots = [tmp_path / "scratch/checkout", tmp_path / "store", tmp_path / "store/inner", Path("/")]
    assert folders_to_cover(roots, keep=[], invisible=[tmp_path / "scratch"]) == [tmp_path / "store"]


def test_the_installation_is_this_checkout_and_each_package():
    folders = installation_folders()
    repo = Path(__file__).resolve().parents[2]
    assert repo in folders and repo / "kuberl" in folders
    assert repo / "env-images" / "kuberl_sandbox" in folders and repo / "trainer" / "kuberl_trainer" in folders
