"""The pre-flight check: passes on a machine that can run the lessons, fails with a clear line
when it cannot."""

import os
import subprocess
import sys

from conftest import REPO


def doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "helpers.doctor", *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_this_machine_is_ready_for_the_live_lessons():
    done = doctor()
    assert done.returncode == 0, done.stdout
    assert "PASS  2-rank gloo job" in done.stdout
    assert "PASS  torch.distributed.rpc" in done.stdout
    assert "PASS  debug server" in done.stdout and "127.0.0.1" in done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith("READY")


def test_the_doctor_launches_for_real_even_in_recorded_mode():
    done = doctor(env={"PDP_RECORDED": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS  2-rank gloo job" in done.stdout


def test_a_missing_package_fails_with_its_name_and_points_to_recorded_mode(tmp_path):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("numpy==2.4.6\nnot-a-real-package==1.0\n")

    done = doctor("--requirements", str(requirements))

    assert done.returncode == 1
    assert "FAIL  packages               not installed: not-a-real-package" in done.stdout
    assert "NOT READY" in done.stdout and "make lab RECORDED=1" in done.stdout


def test_a_missing_package_the_lessons_do_without_only_warns(tmp_path, monkeypatch):
    from helpers import doctor as doctor_module

    monkeypatch.setattr(doctor_module, "NOT_FOR_THE_LESSONS", {"not-a-real-tool"})
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("numpy==2.4.6\nnot-a-real-tool==1.0\n")

    check = doctor_module._packages(requirements)

    assert check.status == "WARN" and "used only by the tests, the site" in check.detail
    assert "not-a-real-tool" in check.detail
