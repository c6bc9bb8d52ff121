"""`config validate`, `config apply` and `serve --dry-run` refuse an artifact a worker could not
load here (exit 78), naming the deployment, the artifact, the places looked in and what is
accepted (issue 30: the page's own outlier example used to pass validate, then fail at start)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.test_config_cli import run
from vllm_sr.errors import EXIT_DO_NOT_RESTART

# The page's "Eject a replica that keeps timing out" example, as pasted (indentation restored).
PAGE_OUTLIER_EXAMPLE = """\
global:
  model_catalog:
    deployments:
      primary:
        provider: model_runtime
        artifact: vllm-sr/Vela-2.0-4B
        replicas:
          - device: rocm:0
          - device: rocm:1
        outlier_detection:
          consecutive_timeouts: 3 # default 3; 0 turns ejection off
          base_ejection_ms: 30000 # default 30000
          max_ejection_ms: 300000 # default ten times the base, at most an hour
          max_ejection_percent: 50 # default 50
"""


@pytest.fixture(autouse=True)
def _no_host_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The runner's /etc/vllm-sr/vllm-sr.toml (if any) is not the test's."""
    from vllm_sr.config import service

    monkeypatch.setattr(service, "DEFAULT_SERVICE_CONFIG_PATH", tmp_path / "absent.toml")
    monkeypatch.delenv("VLLM_SR_WORKER_ARGV", raising=False)


def install(root: Path, name: str) -> Path:
    """What resolution checks of an installed model: a directory with config.json and weights."""
    d = root / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (d / "model.safetensors").write_bytes(b"weights")
    return d


def test_validate_refuses_the_page_example_naming_deployment_artifact_and_places(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(PAGE_OUTLIER_EXAMPLE)
    root = tmp_path / "artifacts"
    code, out, err = run(
        ["config", "validate", "--config", str(cfg), "--artifacts-dir", str(root)], capsys
    )
    assert code == EXIT_DO_NOT_RESTART and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith(
        f"vllm-sr: {cfg}:6: global.model_catalog.deployments.primary.artifact: "
        "deployment 'primary' cannot load here: artifact 'vllm-sr/Vela-2.0-4B' is not accepted"
    )
    assert f"{root / 'Vela-2.0-4B'} (artifacts directory: no such directory)" in line
    assert "(local directory: no such directory)" in line
    assert "a built-in name (vllm-sr/d3-edge)" in line and f"artifacts directory {root}" in line
    code, out, _ = run(
        ["config", "validate", "--config", str(cfg), "--artifacts-dir", str(root), "--json"], capsys
    )
    body = json.loads(out)
    assert code == EXIT_DO_NOT_RESTART and body["valid"] is False
    assert len(body["problems"]) == 1 and "Vela-2.0-4B" in body["problems"][0]

    install(root, "Vela-2.0-4B")
    code, out, _ = run(
        ["config", "validate", "--config", str(cfg), "--artifacts-dir", str(root)], capsys
    )
    assert code == 0 and out.strip() == f"{cfg}: valid (1 deployment)"


def test_validate_reads_artifacts_dir_from_the_host_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(PAGE_OUTLIER_EXAMPLE)
    root = tmp_path / "models"
    install(root, "Vela-2.0-4B")
    toml = tmp_path / "vllm-sr.toml"
    toml.write_text(f'artifacts_dir = "{root}"\n')
    assert run(["config", "validate", "--config", str(cfg)], capsys)[0] == EXIT_DO_NOT_RESTART
    code, _, err = run(
        ["config", "validate", "--config", str(cfg), "--service-config", str(toml)], capsys
    )
    assert code == 0, err
    # The flag overrides the file, as serve's host flags do.
    code, _, err = run(
        ["config", "validate", "--config", str(cfg), "--service-config", str(toml),
         "--artifacts-dir", str(tmp_path / "elsewhere")],
        capsys,
    )  # fmt: skip
    assert code == EXIT_DO_NOT_RESTART and str(tmp_path / "elsewhere" / "Vela-2.0-4B") in err


def test_every_deployment_is_checked_but_attached_ones_load_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "global:\n  model_catalog:\n    deployments:\n"
        "      a:\n        artifact: vllm-sr/one\n        device: cpu\n"
        "      b:\n        artifact: /no/such/model\n        device: cpu\n"
        "      c:\n        artifact: vllm-sr/remote-only\n"
        "        endpoint: http://127.0.0.1:9\n        model: c\n"
    )
    root = tmp_path / "artifacts"
    code, _, err = run(
        ["config", "validate", "--config", str(cfg), "--artifacts-dir", str(root)], capsys
    )
    lines = err.strip().splitlines()
    assert code == EXIT_DO_NOT_RESTART and len(lines) == 2
    assert lines[0].startswith(f"vllm-sr: {cfg}:5: ") and "deployment 'a'" in lines[0]
    assert lines[1].startswith(f"vllm-sr: {cfg}:8: ") and "'/no/such/model'" in lines[1]
    assert "remote-only" not in err


def test_apply_refuses_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "config.yaml"
    root = tmp_path / "artifacts"
    flags = ["--config", str(cfg), "--artifacts-dir", str(root)]
    assert run(["config", "apply", *flags], capsys)[0] == 0
    before = cfg.read_text()
    code, out, err = run(["config", "apply", "vllm-sr/Vela-2.0-4B", *flags], capsys)
    assert code == EXIT_DO_NOT_RESTART and out == ""
    assert "deployment 'primary' cannot load here: artifact 'vllm-sr/Vela-2.0-4B'" in err
    assert cfg.read_text() == before
    install(root, "Vela-2.0-4B")
    code, out, err = run(["config", "apply", "vllm-sr/Vela-2.0-4B", *flags], capsys)
    assert code == 0, err
    assert "artifact: vllm-sr/Vela-2.0-4B" in cfg.read_text()


def test_serve_dry_run_refuses_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(PAGE_OUTLIER_EXAMPLE.replace("rocm:0", "cpu").replace("rocm:1", "cpu"))
    root = tmp_path / "artifacts"
    argv = ["serve", "--config", str(cfg), "--dry-run", "--artifacts-dir", str(root)]
    code, out, err = run(argv, capsys)
    assert code == EXIT_DO_NOT_RESTART and out == ""
    assert f"{cfg}:6: global.model_catalog.deployments.primary.artifact" in err
    assert "Vela-2.0-4B (artifacts directory: no such directory)" in err
    install(root, "Vela-2.0-4B")
    code, out, err = run(argv, capsys)
    assert code == 0 and "primary-1" in out, err


def test_a_reload_naming_an_artifact_that_cannot_load_is_refused(tmp_path: Path) -> None:
    """serve's planner (start and every SIGHUP reload) runs the same check."""
    from vllm_sr.errors import ConfigError
    from vllm_sr.supervisor.service import config_planner

    cfg = tmp_path / "config.yaml"
    cfg.write_text(PAGE_OUTLIER_EXAMPLE.replace("rocm:0", "cpu").replace("rocm:1", "cpu"))
    root = tmp_path / "artifacts"
    plan = config_planner(cfg, root)
    with pytest.raises(ConfigError) as info:
        plan()
    assert info.value.exit_code == EXIT_DO_NOT_RESTART
    (problem,) = info.value.problems
    assert info.value.message == problem  # what a refused reload's reload_failed says
    assert problem.startswith(f"{cfg}:6: ") and "deployment 'primary' cannot load here" in problem
    install(root, "Vela-2.0-4B")
    assert [s.id for s in plan().deployments["primary"].replicas] == ["primary-0", "primary-1"]
