"""Round-trip writes keep the operator's comments, key order and other keys (golden files in
tests/golden/), writes are atomic, and the host settings TOML has documented defaults."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from vllm_sr.config import files
from vllm_sr.config.files import EMBEDDED_DEFAULT_YAML, atomic_write, load_config
from vllm_sr.config.flags import DeploymentFlags
from vllm_sr.config.service import (
    ServiceSettings,
    default_service_toml,
    load_service_settings,
)
from vllm_sr.errors import ConfigError
from vllm_sr.placement.apply import apply_flags, apply_scale
from vllm_sr.placement.cpu import CpuBudget
from vllm_sr.placement.gpus import GpuInfo

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
BUDGET = CpuBudget(cpus=8, affinity=tuple(range(8)), machine_cpus=8)


def _inv(platform: str) -> list[GpuInfo]:
    return [GpuInfo("rocm", i, "MI100", 32 << 30, 1 << 30) for i in range(4)]


def _copy(tmp_path: Path) -> Path:
    p = tmp_path / "config.yaml"
    shutil.copy(GOLDEN / "config_commented.yaml", p)
    return p


@pytest.mark.parametrize(
    ("golden", "run"),
    [
        (
            "config_commented.dp3-e-tokens.yaml",
            lambda p: apply_flags(
                p,
                DeploymentFlags(data_parallel_size=3, engine=True, max_num_batched_tokens=8192),
                dry_run=False,
                env={},
                inventory=_inv,
                cpu_budget=BUDGET,
            ),
        ),
        (
            "config_commented.dp1.yaml",
            lambda p: apply_flags(
                p,
                DeploymentFlags(data_parallel_size=1),
                dry_run=False,
                env={},
                inventory=_inv,
                cpu_budget=BUDGET,
            ),
        ),
        (
            "config_commented.scale-classifier-2.yaml",
            lambda p: apply_scale(p, "classifier", 2, env={}, inventory=_inv, cpu_budget=BUDGET),
        ),
    ],
)
def test_round_trip_matches_golden(tmp_path: Path, golden: str, run) -> None:  # type: ignore[no-untyped-def]
    p = _copy(tmp_path)
    result = run(p)
    assert result.changed and result.written
    assert p.read_text() == (GOLDEN / golden).read_text()


def test_unchanged_flags_leave_the_file_byte_identical(tmp_path: Path) -> None:
    p = _copy(tmp_path)
    before = p.read_bytes()
    mtime = p.stat().st_mtime_ns
    result = apply_flags(
        p,
        DeploymentFlags(model="vllm-sr/d3-edge", platform="rocm", data_parallel_size=2),
        dry_run=False,
        env={},
        inventory=_inv,
        cpu_budget=BUDGET,
    )
    assert not result.changed and not result.written and result.diff == ""
    assert p.read_bytes() == before and p.stat().st_mtime_ns == mtime


def test_dry_run_changes_nothing_and_shows_the_diff(tmp_path: Path) -> None:
    p = _copy(tmp_path)
    before = p.read_bytes()
    result = apply_flags(
        p,
        DeploymentFlags(data_parallel_size=3),
        dry_run=True,
        env={},
        inventory=_inv,
        cpu_budget=BUDGET,
    )
    assert result.changed and not result.written
    assert "+          - device: rocm:1" in result.diff
    assert p.read_bytes() == before
    assert [r.device for r in result.plan.for_deployment("primary")] == [
        "rocm:2",
        "rocm:0",
        "rocm:1",
    ]


def test_missing_file_gets_the_embedded_default(tmp_path: Path) -> None:
    p = tmp_path / "etc" / "config.yaml"
    result = apply_flags(
        p, DeploymentFlags(), dry_run=False, env={}, inventory=_inv, cpu_budget=BUDGET
    )
    assert result.written and p.read_text() == EMBEDDED_DEFAULT_YAML
    assert result.diff.startswith("--- /dev/null")


def test_invalid_file_is_not_rewritten(tmp_path: Path) -> None:
    p = tmp_path / "config.yaml"
    p.write_text("global:\n  bogus: 1\n")
    with pytest.raises(ConfigError):
        apply_flags(
            p,
            DeploymentFlags(data_parallel_size=2),
            dry_run=False,
            env={},
            inventory=_inv,
            cpu_budget=BUDGET,
        )
    assert p.read_text() == "global:\n  bogus: 1\n"


def test_atomic_write_keeps_old_file_when_rename_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = tmp_path / "config.yaml"
    p.write_text("old\n")
    p.chmod(0o640)

    def broken_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "replace", broken_replace)
    with pytest.raises(OSError):
        atomic_write(p, "new\n")
    assert p.read_text() == "old\n"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["config.yaml"]  # no temp left


def test_atomic_write_replaces_and_keeps_mode(tmp_path: Path) -> None:
    p = tmp_path / "config.yaml"
    p.write_text("old\n")
    p.chmod(0o640)
    inode = p.stat().st_ino
    atomic_write(p, "new\n")
    assert p.read_text() == "new\n"
    assert p.stat().st_mode & 0o777 == 0o640
    assert p.stat().st_ino != inode  # a rename, not an in-place rewrite


def test_load_config_unreadable(tmp_path: Path) -> None:
    p = tmp_path / "config.yaml"
    p.write_bytes(b"\xff\xfe global")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(p)


# Host settings -----------------------------------------------------------------------------


def test_service_defaults_when_default_file_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from vllm_sr.config import service

    monkeypatch.setattr(service, "DEFAULT_SERVICE_CONFIG_PATH", tmp_path / "absent.toml")
    s = load_service_settings(None, {})
    assert s == ServiceSettings()
    assert (s.listen, str(s.control_socket), s.control_group, s.admin_group) == (
        "127.0.0.1:8080",
        "/run/vllm-sr/control.sock",
        "vllm-sr",
        None,
    )
    assert (str(s.runtime_dir), str(s.state_dir), s.ready_timeout_s, s.drain_timeout_s) == (
        "/run/vllm-sr",
        "/var/lib/vllm-sr",
        600.0,
        30.0,
    )


def test_explicit_missing_service_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--service-config .*absent.toml: no such file"):
        load_service_settings(tmp_path / "absent.toml", {})


def test_service_file_then_flag_overrides(tmp_path: Path) -> None:
    p = tmp_path / "vllm-sr.toml"
    p.write_text('# host\nlisten = "0.0.0.0:9000"\nruntime_dir = "/run/x"\nadmin_group = "ops"\n')
    s = load_service_settings(p, {"listen": "127.0.0.1:7000", "control_socket": None})
    assert (s.listen, str(s.runtime_dir), s.admin_group) == ("127.0.0.1:7000", "/run/x", "ops")
    assert str(s.control_socket) == "/run/vllm-sr/control.sock"  # None = flag not given
    assert s.workers_dir == Path("/run/x/workers")


def test_service_file_problems_all_reported(tmp_path: Path) -> None:
    p = tmp_path / "vllm-sr.toml"
    p.write_text('listen = "nowhere"\nlog_format = "xml"\ncolour = 1\n')
    with pytest.raises(ConfigError) as exc:
        load_service_settings(p, {})
    text = "\n".join(exc.value.problems)
    assert "listen" in text and "'nowhere'" in text and "HOST:PORT" in text
    assert "log_format" in text and "'xml'" in text
    assert "colour: unknown key; accepted: listen" in text


def test_service_toml_syntax_error_has_a_line(tmp_path: Path) -> None:
    p = tmp_path / "vllm-sr.toml"
    p.write_text('listen = "a:1"\nthis is not toml\n')
    with pytest.raises(ConfigError, match=r"vllm-sr.toml:2: TOML syntax"):
        load_service_settings(p, {})


def test_default_service_toml_round_trips(tmp_path: Path) -> None:
    p = tmp_path / "vllm-sr.toml"
    p.write_text(default_service_toml())
    assert load_service_settings(p, {}) == ServiceSettings()
    assert "# Frontend HTTP address" in p.read_text()


def test_listen_host_port() -> None:
    assert ServiceSettings(listen="[::1]:8081").listen_host_port() == ("::1", 8081)
    assert ServiceSettings(listen="localhost:80").listen_host_port() == ("localhost", 80)
    with pytest.raises(ValueError, match="HOST:PORT"):
        ServiceSettings(listen="127.0.0.1:70000")


@pytest.mark.parametrize("n", [1, 4])
def test_comment_block_after_the_list_stays_after_it(tmp_path: Path, n: int) -> None:
    """ruamel files the comment lines after a list under its last item; a resize must not drop
    them (shrink) or bury them between items (grow)."""
    p = tmp_path / "config.yaml"
    shutil.copy(GOLDEN / "config_trailing_comment.yaml", p)
    apply_scale(p, "primary", n, env={}, inventory=_inv, cpu_budget=BUDGET)
    text = p.read_text()
    assert text == (GOLDEN / f"config_trailing_comment.scale-{n}.yaml").read_text()
    lines = text.splitlines()
    assert lines[lines.index("        # how to eject") + 1] == "        outlier_detection:"
    assert lines[lines.index("        # how to eject") - 2].startswith("          - device: rocm:")


def test_write_happens_under_the_directory_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """apply (operator) and scale (control API) serialize their read-modify-write cycles."""
    import fcntl
    import os

    from vllm_sr.placement import apply as apply_mod

    p = _copy(tmp_path)
    seen: list[bool] = []
    real_write = apply_mod.atomic_write

    def probing_write(path: Path, text: str) -> None:
        fd = os.open(tmp_path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            seen.append(False)
        except BlockingIOError:
            seen.append(True)
        finally:
            os.close(fd)
        real_write(path, text)

    monkeypatch.setattr(apply_mod, "atomic_write", probing_write)
    apply_scale(p, "primary", 1, env={}, inventory=_inv, cpu_budget=BUDGET)
    assert seen == [True]


# --threads: the round-trip write ------------------------------------------------------------


def _cpu_copy(tmp_path: Path) -> Path:
    p = tmp_path / "config.yaml"
    shutil.copy(GOLDEN / "config_cpu.yaml", p)
    return p


def _threads(p: Path, n: int, **flags: object):  # type: ignore[no-untyped-def]
    return apply_flags(
        p,
        DeploymentFlags(threads=n, **flags),  # type: ignore[arg-type]
        dry_run=False,
        env={},
        inventory=_inv,
        cpu_budget=BUDGET,
    )


def test_threads_flag_writes_the_deployment_field_round_trip(tmp_path: Path) -> None:
    """--threads N lands as the default deployment's threads, after its scalar settings and
    before replicas; comments and every other key stay; the plan uses it."""
    p = _cpu_copy(tmp_path)
    result = _threads(p, 4)
    assert result.written
    assert p.read_text() == (GOLDEN / "config_cpu.threads-4.yaml").read_text()
    assert [s.threads for s in result.plan.for_deployment("edge")] == [4, 4]
    again = _threads(p, 4)  # the same value again: not even rewritten
    assert not again.changed and not again.written
    assert p.read_text() == (GOLDEN / "config_cpu.threads-4.yaml").read_text()


def test_threads_flag_changes_the_value_in_place(tmp_path: Path) -> None:
    p = tmp_path / "config.yaml"
    shutil.copy(GOLDEN / "config_cpu.threads-4.yaml", p)
    _threads(p, 2, data_parallel_size=1)
    assert p.read_text() == (GOLDEN / "config_cpu.threads-4-dp1-threads-2.yaml").read_text()


def test_threads_flag_on_a_gpu_deployment_is_refused_and_nothing_written(tmp_path: Path) -> None:
    p = _copy(tmp_path)  # primary runs on rocm
    before = p.read_bytes()
    with pytest.raises(ConfigError) as exc:
        _threads(p, 2)
    text = "\n".join(exc.value.problems)
    assert "global.model_catalog.deployments.primary.threads" in text
    assert "threads 2 applies to CPU workers, but this deployment runs on rocm GPUs" in text
    assert p.read_bytes() == before


def test_a_load_runs_the_config_rules_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """collect_problems runs semantic_problems on the raw mapping and switches the model's own
    run off; building a RootConfig directly still runs them."""
    from vllm_sr.config import file_rules
    from vllm_sr.config.problems import Problem
    from vllm_sr.config.schema import RootConfig

    calls: list[object] = []
    real = file_rules.semantic_problems

    def counted(raw: object) -> list[Problem]:
        calls.append(raw)
        return real(raw)

    monkeypatch.setattr(file_rules, "semantic_problems", counted)
    config, problems = files.collect_problems({"global": {"router": {"enabled": False}}})
    assert config is not None and problems == [] and len(calls) == 1
    RootConfig.model_validate({"global": {"router": {"enabled": False}}})
    assert len(calls) == 2


def test_a_load_runs_each_section_rule_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The section models' own rules (Routing: routing_local_problems, Providers:
    providers_problems) are part of the raw pass too: a load runs each once per routing (the
    top level's and each recipe's) and once for providers, not again per recipe."""
    from collections import Counter

    from vllm_sr.config import routing, routing_providers, routing_rules
    from vllm_sr.config.problems import Problem

    calls: Counter[str] = Counter()

    def counting(module: object, name: str) -> None:
        real = getattr(module, name)

        def counted(raw: object) -> list[Problem]:
            calls[name] += 1
            result: list[Problem] = real(raw)
            return result

        monkeypatch.setattr(module, name, counted)

    for module in (routing, routing_rules):
        counting(module, "routing_local_problems")
    for module in (routing_providers, routing_rules):
        counting(module, "providers_problems")
    text = (Path(__file__).parents[1] / "fixtures/upstream/recipes/mom-v1/config.yaml").read_text()
    doc = files.to_plain(files.parse_document(text))
    assert isinstance(doc, dict)
    recipes = len(doc["recipes"])
    files.collect_problems(doc)  # mom-v1 loads (every looper runs): the rules still ran
    assert recipes == 5
    assert calls == {"routing_local_problems": 1 + recipes, "providers_problems": 1}
