"""Logging setup shared by the service and its workers. (Owned by the systemd work: journald
fields are added there; until then plain lines on stderr.)"""

from __future__ import annotations

import logging
import sys


def setup_logging(component: str, replica: str | None = None, level: int = logging.INFO) -> None:
    """Configure the root logger once for this process."""
    prefix = f"{component}[{replica}]" if replica else component
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"%(asctime)s {prefix} %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
