"""The control test fake (tests/support/control_fake.py) answers as the real supervisor does:
the same commands on the real ``Supervisor`` (in-memory workers, fake clock) and on the fake
give the same answers, the same events with the same fields, and inventory and health
documents of the same shape. A change to the supervisor's answers fails here, not in a
dashboard test that trusted the fake."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.support.control_fake import FakeBackend
from tests.unit.test_supervisor_handlers import Harness, plan_of, serve
from vllm_sr.clock import FakeClock
from vllm_sr.control.commands import Command
from vllm_sr.events import Event

SCRIPT: list[dict[str, Any]] = [
    {"kind": "eject", "replica": "primary-0", "duration_ms": 5000},
    {"kind": "readmit", "replica": "primary-0"},
    {"kind": "drain", "replica": "primary-1"},
    {"kind": "readmit", "replica": "primary-1"},
    {"kind": "eject", "replica": "primary-1"},
]


def _shape(doc: Any) -> Any:
    """Keys all the way down (values only where they are the contract: states, counts)."""
    if isinstance(doc, dict):
        return {k: _shape(v) for k, v in doc.items() if k not in ("limits", "usage")}
    if isinstance(doc, list):
        return [_shape(v) for v in doc]
    return doc if isinstance(doc, str | bool) or doc is None else type(doc).__name__


def _replica_shapes(inventory: dict[str, Any]) -> list[Any]:
    return [
        {k: v for k, v in _shape(r).items() if k not in ("pid", "revision", "threads")}
        for d in inventory["deployments"]
        for r in d["replicas"]
    ]


async def _run(submit: Any, events: list[Event]) -> list[tuple[Any, list[tuple[str, list[str]]]]]:
    out = []
    for step in SCRIPT:
        before = len(events)
        answer = await asyncio.wait_for(submit(Command(**step)), 10)
        # The service's own announcements (service_ready, from its maintenance task) aside.
        fired = [(e.event, sorted(e.fields)) for e in events[before:] if e.event != "service_ready"]
        out.append((_shape(answer), fired))
    return out


def _real() -> dict[str, Any]:
    seen: dict[str, Any] = {}

    async def body(h: Harness) -> None:
        events: list[Event] = []
        h.sup.events.add_sink(events.append)
        seen["health"] = _shape(h.sup.health())
        seen["service"] = sorted(h.sup.inventory()["service"])
        seen["steps"] = await _run(h.sup.submit, events)
        seen["replicas"] = _replica_shapes(h.sup.inventory())
        seen["deployment"] = sorted(h.sup.inventory()["deployments"][0])

    serve([plan_of(2)], body)
    return seen


def _fake() -> dict[str, Any]:
    backend = FakeBackend({"primary": ["cpu", "cpu"]}, clock=FakeClock())
    events: list[Event] = []
    backend.events.add_sink(events.append)
    seen: dict[str, Any] = {
        "health": _shape(backend.health()),
        "service": sorted(backend.inventory()["service"]),
        "steps": asyncio.run(_run(backend.submit, events)),
    }
    seen["replicas"] = _replica_shapes(backend.inventory())
    seen["deployment"] = sorted(backend.inventory()["deployments"][0])
    return seen


def test_the_fake_answers_as_the_supervisor_does() -> None:
    real, fake = _real(), _fake()
    assert fake["health"] == real["health"]
    assert fake["service"] == real["service"]
    for (fake_answer, fake_events), (real_answer, real_events), step in zip(
        fake["steps"], real["steps"], SCRIPT, strict=True
    ):
        assert fake_answer == real_answer, step
        assert fake_events == real_events, step
    assert fake["deployment"] == real["deployment"]
    assert fake["replicas"] == real["replicas"]
