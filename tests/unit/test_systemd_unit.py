"""The shipped unit and its snippets: the settings the issue asks for, `systemd-analyze verify`
and the offline security score (where systemd-analyze exists). The unit under a real systemd
is tested in tests/system."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from vllm_sr.cli import build_parser
from vllm_sr.commands import ctl
from vllm_sr.config.service import ServiceSettings
from vllm_sr.control.client import COMMAND_TIMEOUT_S
from vllm_sr.supervisor.reconfigure import RELOAD_MARGIN_S

SYSTEMD = Path(__file__).resolve().parents[2] / "packaging" / "systemd"
UNIT = SYSTEMD / "vllm-sr.service"


def settings(path: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";", "[")):
            key, value = line.split("=", 1)
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def seconds(value: str) -> float:
    m = re.fullmatch(r"(\d+)(s|min)?", value)
    assert m, value
    return float(m.group(1)) * (60 if m.group(2) == "min" else 1)


def test_unit_has_the_required_settings() -> None:
    s = settings(UNIT)
    expected = {
        "Type": ["notify"],
        "NotifyAccess": ["main"],
        "ExecStart": ["/usr/bin/vllm-sr serve --config /etc/vllm-sr/config.yaml"],
        "ExecReload": ["/usr/bin/vllm-sr ctl reload"],
        "Restart": ["on-failure"],
        "KillMode": ["mixed"],
        "User": ["vllm-sr"],
        "Group": ["vllm-sr"],
        "SupplementaryGroups": ["render video"],
        "RuntimeDirectory": ["vllm-sr"],
        "StateDirectory": ["vllm-sr"],
        "ConfigurationDirectory": ["vllm-sr"],
        "RestartPreventExitStatus": ["78"],
    }
    assert {k: s.get(k) for k in expected} == expected
    assert seconds(s["WatchdogSec"][0]) > 0


def test_reload_is_the_control_command_that_waits_for_the_outcome() -> None:
    # Not a signal (kill exits at once, so systemd would count the reload done and good).
    argv = settings(UNIT)["ExecReload"][0].split()
    assert argv[0] == settings(UNIT)["ExecStart"][0].split()[0]
    args = build_parser().parse_args(argv[1:])
    # The defaults: the socket and the wait come from the host settings the service reads too.
    assert (args.func, args.socket, args.timeout) == (ctl._reload, None, None)


def test_reload_time_bounds_nest() -> None:
    """systemd times a reload with TimeoutStartSec=; the service extends it to what its own
    reload may take (new workers' ready timeout + margin), and the reload command waits
    longer than that, so neither cuts a reload short that the service would still apply."""
    defaults = ServiceSettings()
    service_bound = defaults.ready_timeout_s + RELOAD_MARGIN_S
    start = seconds(settings(UNIT)["TimeoutStartSec"][0])
    # The extension is sent with RELOADING=1 (tests/integration/test_supervisor.py).
    assert max(start, service_bound) < COMMAND_TIMEOUT_S


def test_stop_timeout_exceeds_drain_and_grace() -> None:
    defaults = ServiceSettings()
    stop = seconds(settings(UNIT)["TimeoutStopSec"][0])
    assert stop > defaults.drain_timeout_s + defaults.stop_grace_s


def test_gpu_devices_stay_reachable() -> None:
    s = settings(UNIT)
    assert "PrivateDevices" not in s
    assert s["DevicePolicy"] == ["closed"]
    allowed = {v.split()[0] for v in s["DeviceAllow"]}
    assert {"/dev/kfd", "char-drm", "char-nvidia-frontend", "char-nvidia-uvm"} <= allowed
    assert all(v.split()[1] == "rw" for v in s["DeviceAllow"])


def test_sysusers_and_tmpfiles() -> None:
    sysusers = (SYSTEMD / "vllm-sr.sysusers").read_text()
    assert re.search(r"^u vllm-sr - .* /var/lib/vllm-sr ", sysusers, re.M)
    assert re.search(r"^m vllm-sr render$", sysusers, re.M)
    tmpfiles = (SYSTEMD / "vllm-sr.tmpfiles").read_text()
    assert re.search(r"^d /var/lib/vllm-sr 0750 vllm-sr vllm-sr", tmpfiles, re.M)
    # The artifacts_dir default, which the .deb's postinst creates through tmpfiles.
    default = str(ServiceSettings().artifacts_dir)
    assert re.search(rf"^d {default} 0750 vllm-sr vllm-sr", tmpfiles, re.M)


needs_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed"
)


@needs_analyze
def test_systemd_analyze_verify_is_clean(tmp_path: Path) -> None:
    # verify insists that ExecStart's binary exists; everything else is checked as shipped.
    exe = tmp_path / "vllm-sr"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    unit = tmp_path / "vllm-sr.service"
    unit.write_text(UNIT.read_text().replace("/usr/bin/vllm-sr", str(exe)))
    out = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=30
    )
    assert (out.returncode, out.stdout + out.stderr) == (0, "")


@needs_analyze
def test_security_exposure_at_most_1_6() -> None:
    out = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", str(UNIT)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d)", out.stdout)
    assert m, out.stdout[-500:] + out.stderr[-500:]
    # 1.6 when the reload became a command (issue 31); the bar for a service is 3.0.
    assert float(m.group(1)) <= 1.6


@pytest.mark.skipif(
    shutil.which("systemd-tmpfiles") is None or os.geteuid() != 0,
    reason="needs systemd-tmpfiles and root (it chowns to the service account)",
)
def test_tmpfiles_creates_the_artifacts_dir_for_the_service(tmp_path: Path) -> None:
    """What the .deb's postinst runs (`systemd-tmpfiles --create vllm-sr.conf`), into a scratch
    root whose passwd/group hold the account sysusers makes."""
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "passwd").write_text("vllm-sr:x:998:998::/var/lib/vllm-sr:/bin/false\n")
    (tmp_path / "etc" / "group").write_text("vllm-sr:x:998:\n")
    subprocess.run(
        ["systemd-tmpfiles", "--create", f"--root={tmp_path}", str(SYSTEMD / "vllm-sr.tmpfiles")],
        check=True,
        capture_output=True,
        timeout=60,
    )
    made = tmp_path / str(ServiceSettings().artifacts_dir).lstrip("/")
    st = made.stat()
    assert made.is_dir() and (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (998, 998, 0o750)
