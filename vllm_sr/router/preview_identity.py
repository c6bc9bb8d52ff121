"""The served config's identity on the routing preview: the answer's ``config_hash`` and the
``X-SR-Bench-Expected-Config-Hash`` request precondition (upstream v0.4's sr-bench pins a
preview to one config this way and refuses an answer whose ``config_hash`` differs).

The hash is the one the service reports as ``service.config.served_hash``
(vllm_sr/supervisor/config_source.py): SHA-256 of the config.yaml text the published generation
was planned from, carried to the router on its ``RouterPlan``. ``None`` when the router was built
without a config file (tests, a plan made by hand): the precondition then never holds.
"""

from __future__ import annotations

from collections.abc import Mapping

from vllm_sr.router.eval import EvalError

EXPECTED_HASH_HEADER = "x-sr-bench-expected-config-hash"


class ConfigHashMismatch(EvalError):
    """The caller pinned a config this router is not serving."""

    http_status = 409


def check_expected(headers: Mapping[str, str], config_hash: str | None) -> None:
    """Raise :class:`ConfigHashMismatch` when the request names a config hash (header, any
    case, surrounding quotes and blanks ignored) other than ``config_hash``."""
    raw = headers.get(EXPECTED_HASH_HEADER)
    if raw is None:
        return
    expected = raw.strip().strip('"').strip().lower()
    if config_hash is not None and expected == config_hash.lower():
        return
    served = config_hash if config_hash is not None else "none (no config file)"
    raise ConfigHashMismatch(
        "CONFIG_HASH_MISMATCH",
        f"header X-SR-Bench-Expected-Config-Hash: got {raw!r}; accepted: the served config's "
        f"hash {served}",
    )
