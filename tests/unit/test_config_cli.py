"""`vllm-sr config validate|show|apply` through the real CLI entry point: output, --json,
--dry-run and exit codes."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from vllm_sr.cli import main
from vllm_sr.errors import EXIT_DO_NOT_RESTART, EXIT_USAGE

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "gpu"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def test_validate_ok(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "config.yaml"
    assert run(["config", "apply", "--config", str(p)], capsys)[0] == 0
    code, out, _ = run(["config", "validate", "--config", str(p)], capsys)
    assert code == 0 and out.strip() == f"{p}: valid (1 deployment)"


def test_validate_reports_every_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "config.yaml"
    p.write_text(
        "global:\n  router:\n    enabled: 3\n  model_catalog:\n    deployments:\n"
        "      primary:\n        replicas:\n          - device: gpu0\n"
    )
    code, out, err = run(["config", "validate", "--config", str(p)], capsys)
    assert code == EXIT_DO_NOT_RESTART and out == ""
    lines = err.strip().splitlines()
    assert lines[0].startswith(f"vllm-sr: {p}:3: global.router.enabled: 3")
    assert lines[1].startswith(
        f"vllm-sr: {p}:8: global.model_catalog.deployments.primary."
        "replicas[0].device: 'gpu0' is not a device"
    )
    code, out, _ = run(["config", "validate", "--config", str(p), "--json"], capsys)
    body = json.loads(out)
    assert code == EXIT_DO_NOT_RESTART and body["valid"] is False and len(body["problems"]) == 2


def test_validate_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["config", "validate", "--config", str(tmp_path / "no.yaml")], capsys)
    assert code != 0 and "no such file" in err and "vllm-sr config apply" in err


def test_show_fills_defaults(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "config.yaml"
    p.write_text("global:\n  model_catalog:\n    deployments:\n      a:\n        device: cpu\n")
    code, out, _ = run(["config", "show", "--config", str(p), "--json"], capsys)
    dep = json.loads(out)["global"]["model_catalog"]["deployments"]["a"]
    assert code == 0
    assert dep["replicas"] == [{"device": "cpu"}] and "device" not in dep
    assert dep["timeout_ms"] == 30000 and dep["artifact"] == "vllm-sr/d3-edge"
    assert dep["outlier_detection"]["max_ejection_ms"] == 300000
    code, out, _ = run(["config", "show", "--config", str(p)], capsys)
    assert code == 0 and "max_ejection_percent: 50" in out and "enabled: true" in out


def test_apply_json_and_dry_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "config.yaml"
    code, out, _ = run(
        [
            "config",
            "apply",
            "vllm-sr/d3-edge",
            "-e",
            "--platform",
            "cpu",
            "-dp",
            "2",
            "--config",
            str(p),
            "--dry-run",
            "--json",
        ],
        capsys,
    )
    body = json.loads(out)
    assert code == 0 and not p.exists()
    assert (body["config"], body["changed"], body["written"]) == (str(p), True, False)
    assert [r["id"] for r in body["replicas"]] == ["primary-0", "primary-1"]
    assert set(body["replicas"][0]) == {"id", "deployment", "device", "threads", "cpus", "env"}
    assert "+          - device: cpu" in body["diff"]
    code, out, _ = run(["config", "apply", "-dp", "2", "--config", str(p)], capsys)
    assert code == 0 and out.startswith(f"{p}: written") and "primary-1  cpu" in out
    code, out, _ = run(["config", "apply", "-dp", "2", "--config", str(p)], capsys)
    assert code == 0 and out.startswith(f"{p}: unchanged")


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["-dp", "0"], "-dp 0: accepted: a positive integer"),
        (["-dp", "two"], "-dp 'two': not an integer"),
        (["--platform", "tpu"], "invalid choice: 'tpu'"),
        (["--max-num-seqs", "-1"], "--max-num-seqs -1"),
    ],
)
def test_apply_flag_errors_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str
) -> None:
    code, _, err = run(["config", "apply", "--config", str(tmp_path / "c.yaml"), *argv], capsys)
    assert code == EXIT_USAGE and fragment in err


def test_device_ids_on_cpu_is_one_line_with_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(
        ["config", "apply", "--config", str(tmp_path / "c.yaml"), "--device-ids", "0,1"], capsys
    )
    assert code == EXIT_USAGE and len(err.strip().splitlines()) == 1
    assert "--device-ids 0,1: the platform is cpu; add --platform rocm" in err
    code, _, err = run(
        [
            "config",
            "apply",
            "--config",
            str(tmp_path / "c.yaml"),
            "--platform",
            "rocm",
            "--device-ids",
            "0,x",
        ],
        capsys,
    )
    assert code == EXIT_USAGE and "--device-ids '0,x'" in err


@pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"GPU fixtures not found at {FIXTURES}")
def test_apply_rocm_with_fake_rocm_smi(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fixture = FIXTURES / "rocm-smi_telegraf-flags_mi100-4gpu_rocm6.0.2.json"
    tool = tmp_path / "bin" / "rocm-smi"
    tool.parent.mkdir()
    tool.write_text(f'#!/bin/sh\ncat "{fixture}"\n')
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ['PATH']}")
    p = tmp_path / "config.yaml"
    code, out, _ = run(
        ["config", "apply", "--platform", "rocm", "-dp", "2", "--config", str(p), "--json"], capsys
    )
    body = json.loads(out)
    assert code == 0
    assert [(r["device"], r["env"]["ROCR_VISIBLE_DEVICES"]) for r in body["replicas"]] == [
        ("rocm:0", "0"),
        ("rocm:1", "1"),
    ]
    code, _, err = run(["config", "apply", "-dp", "5", "--config", str(p)], capsys)
    assert code == EXIT_DO_NOT_RESTART
    assert "needs 3 more available rocm GPU(s) but found 2 (4 GPU(s)" in err


OTHER_ON_ROCM0 = """\
global:
  model_catalog:
    deployments:
      other:
        artifact: vllm-sr/d3-edge
        replicas:
          - device: rocm:0
      primary:
        artifact: vllm-sr/d3-edge
        replicas:
          - device: cpu
    system:
      decision_model:
        deployment: primary
"""


def _devices(path: Path, name: str) -> list[str | None]:
    from vllm_sr.config.files import load_config

    return [r.device for r in load_config(path).deployments[name].effective_replicas()]


@pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"GPU fixtures not found at {FIXTURES}")
def test_new_gpu_placement_prefers_gpus_no_other_deployment_uses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 39 item 1, on the real 4-GPU MI100 rocm-smi output: `other` on rocm:0, a new
    `primary` with -dp 2 goes to the idle rocm:1 and rocm:2; sharing happens only when -dp
    needs it, and the plan's notes (config apply, serve --dry-run) say so."""
    fixture = FIXTURES / "rocm-smi_telegraf-flags_mi100-4gpu_rocm6.0.2.json"
    tool = tmp_path / "bin" / "rocm-smi"
    tool.parent.mkdir()
    tool.write_text(f'#!/bin/sh\ncat "{fixture}"\n')
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ['PATH']}")
    for name in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(name, raising=False)
    p = tmp_path / "config.yaml"
    p.write_text(OTHER_ON_ROCM0)
    apply = ["config", "apply", "--platform", "rocm", "-dp", "2", "--config", str(p)]
    code, out, _ = run(apply, capsys)
    assert code == 0 and _devices(p, "primary") == ["rocm:1", "rocm:2"]
    assert "shared" not in out
    # -dp 4 needs a GPU `other` uses: placed after the unused ones, and said so.
    code, out, _ = run(["serve", "-dp", "4", "--dry-run", "--config", str(p)], capsys)
    assert code == 0
    assert (
        "note: rocm:0 is shared with deployment(s) other: -dp 4 needs 2 more GPU(s) and only "
        "1 available GPU(s) are unused by other deployments" in out
    )
    code, out, _ = run([*apply[:4], "-dp", "4", "--config", str(p)], capsys)
    assert code == 0 and _devices(p, "primary") == ["rocm:1", "rocm:2", "rocm:3", "rocm:0"]
    assert "note: rocm:0 is shared with deployment(s) other" in out
    # An authored placement grows by the same rule: rocm:3 (unused) before rocm:0 (other's).
    p.write_text(
        OTHER_ON_ROCM0.replace("- device: cpu", "- device: rocm:1\n          - device: rocm:2")
    )
    code, out, _ = run(["config", "apply", "-dp", "3", "--config", str(p), "--json"], capsys)
    body = json.loads(out)
    assert code == 0 and _devices(p, "primary") == ["rocm:1", "rocm:2", "rocm:3"]
    assert not [n for n in body["notes"] if "shared" in n]


def test_cpu_ranges_notation() -> None:
    from vllm_sr.placement.render import cpu_ranges

    assert cpu_ranges([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert cpu_ranges([3]) == "3"


def test_threads_flag_on_config_apply_and_serve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--threads N writes the default deployment's threads (config apply and serve alike); the
    plan caps it at the CPU budget and says so; 0 is a usage error."""
    p = tmp_path / "config.yaml"
    code, out, _ = run(["config", "apply", "--threads", "64", "--config", str(p), "--json"], capsys)
    assert code == 0
    assert "        threads: 64\n        replicas:\n" in p.read_text()
    body = json.loads(out)
    assert any("deployment primary: threads 64 capped at the" in n for n in body["notes"])
    assert body["replicas"][0]["threads"] < 64
    code, out, _ = run(["serve", "--threads", "2", "--dry-run", "--config", str(p)], capsys)
    assert code == 0 and "-        threads: 64\n+        threads: 2\n" in out
    assert "threads: 64" in p.read_text()  # a dry run writes nothing
    code, _, err = run(["config", "apply", "--threads", "0", "--config", str(p)], capsys)
    assert code == EXIT_USAGE and "--threads 0: accepted: a positive integer (>= 1)" in err


def test_dtype_flag_on_config_apply_and_serve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--dtype writes engine_args.dtype of the default deployment (config apply and serve
    alike), like the other engine flags; a value outside the four is a usage error."""
    p = tmp_path / "config.yaml"
    code, _, _ = run(["config", "apply", "--dtype", "bfloat16", "--config", str(p)], capsys)
    assert code == 0
    assert "        engine_args:\n          dtype: bfloat16\n" in p.read_text()
    code, out, _ = run(["serve", "--dtype", "float32", "--dry-run", "--config", str(p)], capsys)
    assert code == 0 and "-          dtype: bfloat16\n+          dtype: float32\n" in out
    assert "dtype: bfloat16" in p.read_text()  # a dry run writes nothing
    code, _, err = run(["config", "apply", "--dtype", "fp8", "--config", str(p)], capsys)
    assert code == EXIT_USAGE and "invalid choice: 'fp8'" in err
