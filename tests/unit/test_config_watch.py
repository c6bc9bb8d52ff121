"""The config watch's logic on a fake clock: marks (in-place write, rename-over, a ConfigMap's
``..data`` swap), the settle rule, the hash rule (nothing new reloads nothing; a refused file is
not retried until it changes; a reload already running is looked at again), what the service's
config source reports, and how `vllm-sr status` and /metrics show it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from prometheus_client.core import Metric

from vllm_sr import events as ev
from vllm_sr.clock import FakeClock
from vllm_sr.config.watch import Settler, content_hash, file_mark
from vllm_sr.control.commands import Command
from vllm_sr.control.render import config_lines
from vllm_sr.errors import ConfigError, Conflict
from vllm_sr.events import EventBus
from vllm_sr.frontend.metrics import config_families
from vllm_sr.jsontypes import JsonObject
from vllm_sr.supervisor.config_source import ConfigSource
from vllm_sr.supervisor.config_watch import ConfigWatch, poll_interval

SETTLE = 2.0


# -- marks -------------------------------------------------------------------------------------


def test_mark_changes_with_an_in_place_write(tmp_path: Path) -> None:
    p = tmp_path / "config.yaml"
    p.write_text("a: 1\n")
    before = file_mark(p)
    with open(p, "a") as f:
        f.write("b: 2\n")
    after = file_mark(p)
    assert after.ino == before.ino and after != before and after.size > before.size


def test_mark_changes_with_a_rename_over(tmp_path: Path) -> None:
    p = tmp_path / "config.yaml"
    p.write_text("a: 1\n")
    before = file_mark(p)
    (tmp_path / "new").write_text("a: 1\n")  # the same bytes, a new inode
    os.replace(tmp_path / "new", p)
    assert file_mark(p).ino != before.ino


def test_mark_follows_a_configmap_data_swap(tmp_path: Path) -> None:
    for stamp, text in (("..v1", "a: 1\n"), ("..v2", "a: 1\n")):
        (tmp_path / stamp).mkdir()
        (tmp_path / stamp / "config.yaml").write_text(text)
    os.symlink("..v1", tmp_path / "..data")
    os.symlink("..data/config.yaml", tmp_path / "config.yaml")
    before = file_mark(tmp_path / "config.yaml")
    assert before.data_link == "..v1"
    os.symlink("..v2", tmp_path / "..data_tmp")
    os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
    after = file_mark(tmp_path / "config.yaml")
    assert after.data_link == "..v2" and after.ino != before.ino


def test_a_missing_file_has_a_mark(tmp_path: Path) -> None:
    assert not file_mark(tmp_path / "gone.yaml").exists


# -- the settle rule ---------------------------------------------------------------------------


def test_settler_waits_until_the_mark_is_stable(tmp_path: Path) -> None:
    clock = FakeClock()
    p = tmp_path / "c.yaml"
    p.write_text("a: 1\n")
    first = file_mark(p)
    settler = Settler(SETTLE, clock, initial=first)
    assert not settler.observe(first)  # nothing changed
    p.write_text("a: 1\nb:")  # a writer's first half
    half = file_mark(p)
    assert not settler.observe(half)
    clock.advance(SETTLE - 0.5)
    assert not settler.observe(half) and settler.settling
    p.write_text("a: 1\nb: 2\n")  # the rest, before the half settled
    whole = file_mark(p)
    assert not settler.observe(whole)  # the clock starts again
    clock.advance(SETTLE - 0.01)
    assert not settler.observe(whole)
    clock.advance(0.01)
    assert settler.observe(whole)
    settler.acted(whole)
    assert not settler.observe(whole) and not settler.settling


def test_poll_interval_looks_several_times_within_the_settle_time() -> None:
    assert poll_interval(2.0) == 0.25
    assert poll_interval(0.4) == pytest.approx(0.1)
    assert poll_interval(0.01) == 0.05


# -- the watch on a fake clock -----------------------------------------------------------------


class Reloads:
    """The supervisor's submit: records commands; answers, raises or plans as told."""

    def __init__(self, source: ConfigSource, path: Path) -> None:
        self.source = source
        self.path = path
        self.commands: list[Command] = []
        self.raise_next: Exception | None = None

    async def __call__(self, cmd: Command) -> JsonObject:
        self.commands.append(cmd)
        if self.raise_next is not None:
            exc, self.raise_next = self.raise_next, None
            raise exc
        digest = content_hash(self.path.read_bytes())  # what the planner would read
        self.source.read(digest, True)
        self.source.planned(digest)
        return {"ok": True}


def watch_of(tmp_path: Path, text: str = "a: 1\n") -> tuple[ConfigWatch, Reloads, FakeClock]:
    p = tmp_path / "config.yaml"
    p.write_text(text)
    source = ConfigSource(p, watching=True)
    source.read(content_hash(text.encode()), True)  # serve's first plan read it
    source.served_hash = source.read_hash
    reloads = Reloads(source, p)
    clock = FakeClock()
    return ConfigWatch(p, source, reloads, settle_s=SETTLE, clock=clock), reloads, clock


async def settle(watch: ConfigWatch, clock: FakeClock) -> bool:
    """Look, let the settle time pass, look again: what the second look did."""
    await watch.step()
    clock.advance(SETTLE)
    return await watch.step()


async def test_an_unchanged_file_reloads_nothing(tmp_path: Path) -> None:
    watch, reloads, clock = watch_of(tmp_path)
    assert not await settle(watch, clock)
    os.utime(watch.path, (1, 1))  # touched: the mark moves, the content does not
    assert not await settle(watch, clock)
    assert reloads.commands == []


async def test_a_changed_file_reloads_once_after_it_settles(tmp_path: Path) -> None:
    watch, reloads, clock = watch_of(tmp_path)
    await settle(watch, clock)
    watch.path.write_text("a: 2\n")
    assert not await watch.step()  # seen, not yet settled
    clock.advance(SETTLE / 2)
    assert not await watch.step()
    clock.advance(SETTLE / 2)
    assert await watch.step()
    assert [c.source for c in reloads.commands] == ["watch"]
    clock.advance(SETTLE)
    assert not await watch.step()
    assert len(reloads.commands) == 1


async def test_a_file_a_reload_already_read_reloads_nothing(tmp_path: Path) -> None:
    # `ctl scale` writes the file, and its reload reads it before the watch's look settles.
    watch, reloads, clock = watch_of(tmp_path)
    await settle(watch, clock)
    watch.path.write_text("a: 3\n")
    watch.source.read(content_hash(b"a: 3\n"), True)
    assert not await settle(watch, clock)
    assert reloads.commands == []


async def test_a_refused_file_is_not_retried_until_it_changes(tmp_path: Path) -> None:
    watch, reloads, clock = watch_of(tmp_path)
    await settle(watch, clock)
    watch.path.write_text("a: [\n")
    reloads.raise_next = ConfigError("bad", ["config.yaml:1: YAML syntax: ..."])
    assert await settle(watch, clock)
    watch.source.read(content_hash(b"a: [\n"), True)  # the refused reload had read it
    clock.advance(SETTLE)
    assert not await watch.step()
    watch.path.write_text("a: 4\n")  # the fix
    assert await settle(watch, clock)
    assert len(reloads.commands) == 2


async def test_a_reload_already_running_is_looked_at_again(tmp_path: Path) -> None:
    watch, reloads, clock = watch_of(tmp_path)
    await settle(watch, clock)
    watch.path.write_text("a: 5\n")
    reloads.raise_next = Conflict("a reload is already in progress")
    assert not await settle(watch, clock)
    assert await watch.step()  # the next look tries again
    assert len(reloads.commands) == 2


async def test_a_deleted_file_keeps_the_generation(tmp_path: Path) -> None:
    watch, reloads, clock = watch_of(tmp_path)
    await settle(watch, clock)
    watch.path.unlink()
    assert not await settle(watch, clock)
    assert reloads.commands == [] and watch.source.file_hash is None
    assert not watch.source.view()["in_sync"]


async def test_run_looks_every_poll_interval(tmp_path: Path) -> None:
    watch, reloads, _ = watch_of(tmp_path)
    watch.settler.settle_s = 0.0
    watch.poll_s = 0.01
    watch.path.write_text("a: 6\n")
    task = asyncio.create_task(watch.run())
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while not reloads.commands and loop.time() < deadline:
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
    assert [c.kind for c in reloads.commands] == ["reload"]


# -- what the service reports ------------------------------------------------------------------


def test_source_reports_served_against_disk_and_why() -> None:
    bus = EventBus(clock=FakeClock())
    source = ConfigSource(Path("/etc/vllm-sr/config.yaml"), watching=True)
    bus.add_sink(source.on_event)
    source.read("h1", True)
    source.planned("h1")
    bus.publish(ev.POOL_PUBLISHED, generation=0, deployments=["primary"])
    assert source.view()["in_sync"] and source.view()["served_hash"] == "h1"
    source.read("h2", True)  # a reload reads a broken file
    problems = ["config.yaml:7: global.x: 'y' is not accepted; accepted: an integer"]
    bus.publish(ev.RELOAD_FAILED, reason="bad", source="watch", problems=problems)
    view = source.view()
    assert not view["in_sync"] and view["file_hash"] == "h2" and view["served_hash"] == "h1"
    assert view["last_failure"]["problems"] == problems  # type: ignore[index]
    assert view["reload_failures"] == {"watch": 1}
    source.seen_on_disk("h3")  # edited again, not yet reloaded: that failure is not why
    assert source.view()["last_failure"] is None
    source.read("h3", True)
    source.planned("h3")
    bus.publish(ev.POOL_PUBLISHED, generation=1, deployments=["primary"])
    view = source.view()
    assert view["in_sync"] and view["served_hash"] == "h3" and view["reload_failures"]


def test_a_plan_that_never_publishes_is_not_served() -> None:
    bus = EventBus(clock=FakeClock())
    source = ConfigSource(Path("c.yaml"))
    bus.add_sink(source.on_event)
    source.read("h1", True)
    source.planned("h1")
    bus.publish(ev.POOL_PUBLISHED, generation=0, deployments=["primary"])
    source.read("h2", True)
    source.planned("h2")  # its workers then never get ready
    bus.publish(ev.RELOAD_FAILED, reason="not ready", source="control", problems=["not ready"])
    assert source.view()["served_hash"] == "h1"


def inventory_with(view: JsonObject) -> dict[str, object]:
    return {"service": {"config": view}}


def test_status_says_the_file_is_not_served_and_why() -> None:
    view: JsonObject = {
        "path": "/etc/vllm-sr/config.yaml",
        "watch": True,
        "served_hash": "a" * 64,
        "file_hash": "b" * 64,
        "in_sync": False,
        "last_failure": {"source": "watch", "problems": ["config.yaml:3: x: bad; accepted: y"]},
        "reload_failures": {"watch": 1},
    }
    lines = config_lines(inventory_with(view))
    assert "not the one being served" in lines[0] and "b" * 12 in lines[0]
    assert "watch reload was refused" in lines[1]
    assert lines[2].strip() == "config.yaml:3: x: bad; accepted: y"
    assert config_lines(inventory_with({**view, "in_sync": True})) == []
    pending = config_lines(inventory_with({**view, "last_failure": None}))
    assert "once the file settles" in pending[1]
    off = config_lines(inventory_with({**view, "last_failure": None, "watch": False}))
    assert "ctl reload" in off[1]


def samples(families: list[Metric]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def test_metrics_report_the_hashes_and_refusals() -> None:
    view: JsonObject = {
        "served_hash": "a",
        "file_hash": "b",
        "in_sync": False,
        "reload_failures": {"watch": 2, "signal:SIGHUP": 1},
    }
    got = samples(list(config_families(view)))
    assert got[("vllm_sr_config_info", (("file", "b"), ("served", "a")))] == 1
    assert got[("vllm_sr_config_in_sync", ())] == 0
    assert got[("vllm_sr_config_reload_failures_total", (("source", "watch"),))] == 2
    assert got[("vllm_sr_config_reload_failures_total", (("source", "signal:SIGHUP"),))] == 1
    assert list(config_families(None)) == []


def test_without_the_watch_the_view_looks_at_the_file_itself(tmp_path: Path) -> None:
    p = tmp_path / "config.yaml"
    p.write_text("a: 1\n")
    bus = EventBus(clock=FakeClock())
    source = ConfigSource(p, watching=False)
    bus.add_sink(source.on_event)
    source.read(content_hash(b"a: 1\n"), True)
    source.planned(content_hash(b"a: 1\n"))
    bus.publish(ev.POOL_PUBLISHED, generation=0, deployments=["primary"])
    assert source.view()["in_sync"]
    p.write_text("a: 2\n")
    view = source.view()
    assert not view["in_sync"] and view["file_hash"] == content_hash(b"a: 2\n")
    p.unlink()
    assert source.view()["file_hash"] is None
