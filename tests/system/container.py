"""A real systemd booted in systemd-nspawn on an overlay of this machine's root.

The overlay's upper layer hides what a clean Debian host would not have (non-Debian Pythons,
pip caches and wheel mirrors, every checkout's .venv) with whiteouts made before the mount, so
a package installed inside has to stand alone. The host is never written to."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

CONTAINER_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
BOOT_TIMEOUT_S = 90.0


class ContainerError(RuntimeError):
    pass


def wait_for(predicate: Any, timeout_s: float, what: str, interval_s: float = 0.2) -> Any:
    """Poll ``predicate`` until it returns a truthy value or the deadline passes."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval_s)
    raise ContainerError(f"timed out after {timeout_s:.0f}s waiting for {what} (last: {last!r})")


def paths_to_hide() -> list[str]:
    """Host paths a clean Debian machine would not have."""
    hide: set[str] = {
        "/root/.cache",
        "/root/.local",
        "/root/.pyenv",
        "/pyenv-installer",
        "/opt/wheels",
        "/opt/pypi",
        "/opt/pypi-more",
        "/usr/local/lib/python3.11",
        "/etc/pip.conf",
        "/etc/xdg/pip",
        # Image builders' "never start services" policy: a real host starts them on install.
        "/usr/sbin/policy-rc.d",
    }
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        if not prefix.startswith("/usr"):
            hide.add(prefix)
    for base in (Path("/work"), Path("/home"), Path("/root")):
        if base.is_dir():
            for depth in ("*/.venv", "*/*/.venv", ".venv"):
                hide.update(str(p) for p in base.glob(depth))
    present = sorted(p for p in hide if os.path.lexists(p))
    # Hiding a directory hides everything under it; a whiteout below one cannot be made.
    return [p for p in present if not any(p.startswith(q + "/") for q in present)]


def _mirror_dirs(upper: Path, path: str) -> None:
    """Create ``path``'s parents in the upper layer with the lower layer's owner and mode, so
    the merged directories look exactly like the host's."""
    parts = Path(path).parts[1:-1]
    lower = Path("/")
    for part in parts:
        lower = lower / part
        target = upper / lower.relative_to("/")
        if not target.exists():
            st = lower.stat()
            target.mkdir()
            os.chown(target, st.st_uid, st.st_gid)
            os.chmod(target, stat.S_IMODE(st.st_mode))


def _whiteout(upper: Path, path: str) -> None:
    _mirror_dirs(upper, path)
    os.mknod(upper / path.lstrip("/"), stat.S_IFCHR | 0o000, os.makedev(0, 0))


class Container:
    """One booted container. Use as a context manager; ``run`` executes inside it."""

    def __init__(self, base: Path, hide: Iterable[str] = ()) -> None:
        self.base = base
        self.upper = base / "upper"
        self.work = base / "work"
        self.root = base / "root"
        self.hide = list(hide)
        self.console = base / "console.log"
        self._nspawn: subprocess.Popen[bytes] | None = None
        self._mounted = False
        self.init_pid = 0

    def __enter__(self) -> Container:
        try:
            self.boot()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def boot(self) -> None:
        for d in (self.upper, self.work, self.root):
            d.mkdir(parents=True, exist_ok=True)
        for path in self.hide:
            _whiteout(self.upper, path)
        # An opaque, empty /dev: nspawn populates it.
        (self.upper / "dev").mkdir(mode=0o755)
        os.setxattr(self.upper / "dev", "trusted.overlay.opaque", b"y")
        opts = f"lowerdir=/,upperdir={self.upper},workdir={self.work}"
        subprocess.run(
            ["mount", "-t", "overlay", "overlay", "-o", opts, str(self.root)], check=True
        )
        self._mounted = True
        with open(self.console, "wb") as out:
            self._nspawn = subprocess.Popen(
                [
                    "systemd-nspawn",
                    "-D",
                    str(self.root),
                    "--register=no",
                    "--keep-unit",
                    "--private-network",  # its 127.0.0.1:8080 is not the host's
                    "-q",
                    "--boot",
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.init_pid = wait_for(self._find_init, 30, "the container's systemd")
        wait_for(self._booted, BOOT_TIMEOUT_S, "systemctl is-system-running")

    def _find_init(self) -> int:
        assert self._nspawn is not None
        if self._nspawn.poll() is not None:
            raise ContainerError(f"systemd-nspawn exited: {self.console.read_text()[-2000:]}")
        for task in Path(f"/proc/{self._nspawn.pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                with contextlib.suppress(OSError):
                    if Path(f"/proc/{child}/comm").read_text().strip() == "systemd":
                        return int(child)
        return 0

    def _booted(self) -> bool:
        state = self.run(["systemctl", "is-system-running"], check=False).stdout.strip()
        return state in ("running", "degraded")

    def run(
        self,
        argv: list[str],
        check: bool = True,
        timeout: float = 120,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the container as root, with a clean environment."""
        cmd = ["nsenter", f"--target={self.init_pid}", "--all", "--", *argv]
        env = {"PATH": CONTAINER_PATH, "LANG": "C.UTF-8", "SYSTEMD_PAGER": "", "TERM": "dumb"}
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=env, input=input
        )
        if check and proc.returncode != 0:
            raise ContainerError(
                f"{' '.join(argv)} -> {proc.returncode}\nstdout: {proc.stdout[-3000:]}\n"
                f"stderr: {proc.stderr[-3000:]}"
            )
        return proc

    def sh(self, script: str, check: bool = True, timeout: float = 120) -> str:
        return self.run(["sh", "-c", script], check=check, timeout=timeout).stdout

    def path(self, inside: str) -> Path:
        """The host-side path of a file inside the container (writes go to the upper layer)."""
        return self.root / inside.lstrip("/")

    def show(self, unit: str, *props: str) -> dict[str, str]:
        out = self.run(["systemctl", "show", unit, "-p", ",".join(props)]).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self, *args: str) -> list[dict[str, Any]]:
        out = self.run(["journalctl", "--no-pager", "-o", "json", *args], check=False).stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def close(self) -> None:
        if self._nspawn is not None and self._nspawn.poll() is None:
            if self.init_pid:
                with contextlib.suppress(Exception):
                    self.run(["systemctl", "poweroff", "--no-block"], check=False, timeout=10)
            try:
                self._nspawn.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self._nspawn.pid, signal.SIGKILL)
                self._nspawn.wait(timeout=10)
        if self._mounted:
            subprocess.run(["umount", str(self.root)], check=False)
            if os.path.ismount(self.root):
                subprocess.run(["umount", "-l", str(self.root)], check=False)
            self._mounted = False
        shutil.rmtree(self.base, ignore_errors=True)


@contextlib.contextmanager
def booted(base: Path, hide: Iterable[str] = ()) -> Iterator[Container]:
    with Container(base, hide) as c:
        yield c
