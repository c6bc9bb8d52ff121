"""Session fixtures for the system tests: the .deb (built once), a booted container, the
package installed in it. Everything here is skipped, with the reason, unless running as root
with systemd-nspawn available (installed from Debian when missing and we are root)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.system.container import Container, paths_to_hide

REPO = Path(__file__).resolve().parents[2]
DEB_ENV = "VLLM_SR_DEB"  # a prebuilt .deb to test instead of building one


def _install_nspawn() -> None:
    subprocess.run(
        ["apt-get", "install", "-y", "-q", "systemd-container"],
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        capture_output=True,
        check=False,
        timeout=600,
    )


def system_skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "system tests need root (overlay mount, systemd-nspawn)"
    if shutil.which("systemd-nspawn") is None:
        _install_nspawn()
    if shutil.which("systemd-nspawn") is None:
        return "systemd-nspawn missing and `apt-get install systemd-container` failed"
    if not Path("/lib/systemd/systemd").exists():
        return "no systemd on this machine to boot in a container"
    if not Path("/usr/bin/python3.11").exists():
        return "the package needs Debian's python3.11"
    return None


@pytest.fixture(scope="session")
def system_ok() -> None:
    reason = system_skip_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def deb(system_ok: None) -> Path:
    prebuilt = os.environ.get(DEB_ENV)
    if prebuilt:
        return Path(prebuilt)
    # The test installs it once and throws it away: fast compression is enough.
    env = {**os.environ, "DEB_COMPRESS_LEVEL": os.environ.get("DEB_COMPRESS_LEVEL", "1")}
    out = subprocess.run(
        ["bash", str(REPO / "packaging/deb/build.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    if out.returncode != 0:
        pytest.fail(f"packaging/deb/build.sh failed:\n{out.stderr[-4000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def container(system_ok: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Container]:
    with Container(tmp_path_factory.mktemp("nspawn"), paths_to_hide()) as c:
        yield c


@pytest.fixture(scope="session")
def installed(container: Container, deb: Path) -> Container:
    """The .deb installed with apt inside the container (postinst enables and starts it)."""
    inside = f"/var/tmp/{deb.name}"
    shutil.copyfile(deb, container.path(inside))
    container.run(
        ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-q", inside],
        timeout=900,
    )
    return container
