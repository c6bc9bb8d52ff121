"""The router learns the served config's hash from its plan: serve's planner stamps each
RouterPlan with SHA-256 of the text it planned from, the same hash the inventory reports as
``service.config.served_hash`` once that generation is published."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.unit.test_router_config import CONFIG
from vllm_sr.router.preview_identity import ConfigHashMismatch, check_expected
from vllm_sr.supervisor.config_source import ConfigSource
from vllm_sr.supervisor.service import config_planner


def test_each_plan_carries_the_hash_of_the_text_it_came_from(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG)
    source = ConfigSource(cfg)
    plan = config_planner(cfg, source=source)
    first = plan()
    assert first.router is not None
    assert first.router.config_hash == hashlib.sha256(CONFIG.encode()).hexdigest()
    assert first.router.config_hash == source.read_hash
    edited = CONFIG + "\n# an edit\n"
    cfg.write_text(edited)
    second = plan()
    assert second.router is not None
    assert second.router.config_hash == hashlib.sha256(edited.encode()).hexdigest()


def test_check_expected() -> None:
    check_expected({}, None)
    check_expected({}, "ab")
    check_expected({"x-sr-bench-expected-config-hash": ' "AB" '}, "ab")
    with pytest.raises(ConfigHashMismatch) as info:
        check_expected({"x-sr-bench-expected-config-hash": "cd"}, "ab")
    assert info.value.http_status == 409 and info.value.code == "CONFIG_HASH_MISMATCH"
    with pytest.raises(ConfigHashMismatch):
        check_expected({"x-sr-bench-expected-config-hash": "ab"}, None)


def test_the_gate_reads_global_services_api_routing_preview() -> None:
    from vllm_sr.config.schema import GlobalSection
    from vllm_sr.router.preview_limits import PreviewGate

    default = PreviewGate.of(None)
    assert (default.timeout_s, default.max_concurrency) == (120, 16)
    set_ = GlobalSection.model_validate(
        {"services": {"api": {"routing_preview": {"request_timeout_seconds": 7}}}}
    )
    gate = PreviewGate.of(set_)
    assert (gate.timeout_s, gate.max_concurrency) == (7, 16)
    both = GlobalSection.model_validate(
        {"services": {"api": {"routing_preview": {"max_concurrency": 2}}}}
    )
    assert PreviewGate.of(both).max_concurrency == 2
