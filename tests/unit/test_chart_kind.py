"""`make kind-up`, `make kind-e2e` and `make chart-lint` on a machine without their tools: exit
code 2 and a message that names what is missing, before anything is built or installed."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pdcases import ROOT


def run_script(script: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(ROOT / "hack" / script), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "MAKE": "false", **env},  # `make install` must not be reached
    )


@pytest.mark.parametrize("command", ["up", "e2e"])
@pytest.mark.parametrize(
    ("tools", "says"),
    [
        ({"DOCKER": "/nonexistent/docker"}, "'/nonexistent/docker' not found"),
        ({"DOCKER": "true", "KIND": "/nonexistent/kind"}, "'/nonexistent/kind' not found"),
        ({"DOCKER": "false", "KIND": "true"}, "the Docker daemon does not answer"),
    ],
    ids=["no-docker", "no-kind", "no-daemon"],
)
def test_kind_targets_stop_with_exit_code_2_and_say_what_is_missing(command, tools, says):
    result = run_script("kind.sh", command, env=tools)
    assert result.returncode == 2, result.stderr
    assert says in result.stderr
    assert "kind.sigs.k8s.io" in result.stderr  # where to get it
    assert result.stdout == ""


def test_chart_lint_without_helm_stops_with_exit_code_2_and_the_fix(tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("ls", "sort", "tail", "dirname"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    env = {
        "PATH": str(bin_dir),
        "PD_TESTBIN": "",
        "PD_TESTBIN_CACHE": str(tmp_path / "no-cache"),
    }
    result = subprocess.run(
        [shutil.which("bash"), str(ROOT / "hack" / "chart-lint.sh")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert result.returncode == 2, result.stderr
    assert "helm not found" in result.stderr and "make testenv" in result.stderr
