"""Flags -> the canonical resource: edit config.yaml round-trip, plan, write atomically.

``vllm-sr config apply``, ``vllm-sr serve`` and the control API's scale all come through here,
so the file is the only state: there is no separate data-parallel setting anywhere.
"""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import CommentMark
from ruamel.yaml.tokens import CommentToken

from vllm_sr.config.files import (
    atomic_write,
    dump_document,
    parse_config,
    parse_document,
    read_config_text,
)
from vllm_sr.config.flags import DeploymentFlags
from vllm_sr.config.render import render_result
from vllm_sr.config.schema import MAX_REPLICAS, Replica, RootConfig
from vllm_sr.errors import NotFound, UsageError
from vllm_sr.placement.cpu import CpuBudget
from vllm_sr.placement.planner import (
    InventoryProvider,
    PlacementRequest,
    Plan,
    estimated_need_bytes,
    plan,
    real_inventory,
    resize_placement,
)

__all__ = ["ApplyResult", "apply_flags", "apply_scale", "render_result", "write_replicas"]

# Where a new `replicas` key goes: after the last of these that the deployment has.
_REPLICAS_AFTER = ("provider", "artifact", "revision", "engine_args", "timeout_ms")


@dataclass
class ApplyResult:
    config_path: Path
    changed: bool
    diff: str
    config: RootConfig
    plan: Plan
    written: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "config": str(self.config_path),
            "changed": self.changed,
            "written": self.written,
            "replicas": self.plan.to_json(),
            "notes": list(self.plan.notes),
        }


def _replica_map(r: Replica) -> CommentedMap:
    m = CommentedMap()
    for key in ("device", "endpoint", "model"):
        value = getattr(r, key)
        if value is not None:
            m[key] = value
    return m


def _same(item: Any, r: Replica) -> bool:
    return isinstance(item, dict) and {k: v for k, v in item.items()} == dict(_replica_map(r))


def _last_comment(item: Any) -> tuple[list[Any], Any] | None:
    if not isinstance(item, CommentedMap) or not item:
        return None
    entry = item.ca.items.get(list(item.keys())[-1])
    if not entry or len(entry) < 3 or entry[2] is None:
        return None
    return entry, entry[2]


def _take_trailer(item: Any) -> str:
    """Split the comment block that follows ``item`` off its end-of-line comment."""
    found = _last_comment(item)
    if found is None:
        return ""
    entry, token = found
    head, _, rest = token.value.partition("\n")
    if head:
        token.value = head + "\n"
    else:
        entry[2] = None
    return rest


def _give_trailer(item: Any, trailer: str) -> None:
    found = _last_comment(item)
    if found is not None:
        found[1].value = found[1].value.rstrip("\n") + "\n" + trailer
    elif isinstance(item, CommentedMap) and item:
        key = list(item.keys())[-1]
        token = CommentToken("\n" + trailer, CommentMark(0), None)
        entry = item.ca.items.setdefault(key, [None, None, None, None])
        entry[2] = token


def write_replicas(dep_doc: CommentedMap, replicas: list[Replica]) -> None:
    """Put the canonical ``replicas`` into one deployment's mapping, touching as little as
    possible: kept items (and their comments) stay, the tail is trimmed or extended."""
    if "replicas" in dep_doc and isinstance(dep_doc["replicas"], CommentedSeq):
        seq = dep_doc["replicas"]
        for i, r in enumerate(replicas[: len(seq)]):
            if _same(seq[i], r):
                continue
            target = _replica_map(r)
            if isinstance(seq[i], CommentedMap):
                for key in [k for k in seq[i] if k not in target]:
                    del seq[i][key]
                for key, value in target.items():
                    seq[i][key] = value
            else:
                seq[i] = target
        # Comment lines after the list belong, in ruamel's model, to its last item; carry them
        # over to whatever item is last after the resize so they stay where the operator put them.
        trailer = _take_trailer(seq[-1]) if len(seq) != len(replicas) else ""
        while len(seq) > len(replicas):
            del seq[len(seq) - 1]
        for r in replicas[len(seq) :]:
            seq.append(_replica_map(r))
        if trailer:
            _give_trailer(seq[-1], trailer)
        return
    shorthand = [k for k in ("device", "endpoint", "model") if k in dep_doc]
    keys = list(dep_doc.keys())
    if shorthand:
        pos = keys.index(shorthand[0])
    else:
        present = [keys.index(k) + 1 for k in _REPLICAS_AFTER if k in dep_doc]
        pos = max(present) if present else len(keys)
    for key in shorthand:
        del dep_doc[key]
    seq = CommentedSeq([_replica_map(r) for r in replicas])
    dep_doc.insert(min(pos, len(dep_doc)), "replicas", seq)


def _set(mapping: CommentedMap, key: str, value: Any) -> None:
    if mapping.get(key) != value:
        mapping[key] = value


def _child(mapping: CommentedMap, key: str) -> CommentedMap:
    if not isinstance(mapping.get(key), CommentedMap):
        mapping[key] = CommentedMap()
    return mapping[key]


def _deployment_doc(doc: Any, name: str) -> CommentedMap:
    node: CommentedMap = doc["global"]["model_catalog"]["deployments"][name]
    return node


@dataclass(frozen=True)
class _Edit:
    deployment: str | None
    artifact: str | None = None
    engine: bool = False
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    placement: PlacementRequest = field(default_factory=PlacementRequest)


def _edit_document(
    doc: Any,
    current: RootConfig,
    name: str,
    edit: _Edit,
    provider: InventoryProvider,
    env: Mapping[str, str],
) -> list[str]:
    """Apply ``edit`` to the round-trip document in place; returns the placement notes."""
    dep = current.deployments[name]
    dep_doc = _deployment_doc(doc, name)
    if edit.artifact is not None:
        _set(dep_doc, "artifact", edit.artifact)
    if edit.engine:
        _set(_child(doc["global"], "router"), "enabled", False)
    for key in ("max_num_seqs", "max_num_batched_tokens"):
        if getattr(edit, key) is not None:
            _set(_child(dep_doc, "engine_args"), key, getattr(edit, key))
    req = edit.placement
    if req.platform is None and req.count is None and req.device_ids is None:
        return []
    need = estimated_need_bytes(edit.artifact or dep.artifact)
    current_replicas = dep.effective_replicas()
    new, notes = resize_placement(current_replicas, req, inventory=provider, need=need, env=env)
    if [r.model_dump() for r in new] != [r.model_dump() for r in current_replicas]:
        write_replicas(dep_doc, new)
    return notes


@contextlib.contextmanager
def _locked(directory: Path, exclusive: bool) -> Iterator[None]:
    """Serialize read-modify-write cycles (an operator's apply against the control API's
    scale). The lock is on the directory: the file itself is replaced by rename."""
    if not exclusive:
        yield
        return
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _edit_and_finish(
    config_path: Path | str,
    edit: _Edit,
    *,
    dry_run: bool,
    env: Mapping[str, str],
    inventory: InventoryProvider | None,
    cpu_budget: CpuBudget | None,
) -> ApplyResult:
    path = Path(config_path)
    provider = inventory or real_inventory(env)
    with _locked(path.parent, exclusive=not dry_run):
        old_text, existed = read_config_text(path)
        current = parse_config(old_text, str(path))
        doc = parse_document(old_text, str(path))
        name = edit.deployment or current.default_deployment()
        if name not in current.deployments:
            raise NotFound(
                f"deployment {name!r} is not in {path}; accepted: {', '.join(current.deployments)}"
            )
        notes = _edit_document(doc, current, name, edit, provider, env)
        new_text = dump_document(doc)
        config = parse_config(new_text, str(path))
        result_plan = plan(config, env=env, inventory_provider=provider, cpu_budget=cpu_budget)
        result_plan.notes[:0] = notes
        changed = (new_text != old_text) or not existed
        if changed and not dry_run:
            atomic_write(path, new_text)
    diff = "".join(
        difflib.unified_diff(
            old_text.splitlines(keepends=True) if existed else [],
            new_text.splitlines(keepends=True),
            fromfile=str(path) if existed else "/dev/null",
            tofile=str(path),
        )
    )
    return ApplyResult(path, changed, diff, config, result_plan, changed and not dry_run)


def apply_flags(
    config_path: Path | str,
    flags: DeploymentFlags,
    *,
    dry_run: bool,
    env: Mapping[str, str] | None = None,
    inventory: InventoryProvider | None = None,
    cpu_budget: CpuBudget | None = None,
) -> ApplyResult:
    """Write what the flags describe into the canonical resource (the decision model's
    deployment) and plan it. MODEL alone keeps replicas and engine arguments."""
    edit = _Edit(
        deployment=None,
        artifact=flags.model,
        engine=flags.engine,
        max_num_seqs=flags.max_num_seqs,
        max_num_batched_tokens=flags.max_num_batched_tokens,
        placement=PlacementRequest(
            platform=flags.platform, count=flags.data_parallel_size, device_ids=flags.device_ids
        ),
    )
    return _edit_and_finish(
        config_path,
        edit,
        dry_run=dry_run,
        env=os.environ if env is None else env,
        inventory=inventory,
        cpu_budget=cpu_budget,
    )


def apply_scale(
    config_path: Path | str,
    deployment: str,
    replicas: int,
    *,
    dry_run: bool = False,
    env: Mapping[str, str] | None = None,
    inventory: InventoryProvider | None = None,
    cpu_budget: CpuBudget | None = None,
) -> ApplyResult:
    """Resize one deployment to ``replicas`` workers with the same rules as -dp."""
    if not 1 <= replicas <= MAX_REPLICAS:
        raise UsageError(f"replicas {replicas}: accepted: 1..{MAX_REPLICAS}")
    edit = _Edit(deployment=deployment, placement=PlacementRequest(count=replicas))
    return _edit_and_finish(
        config_path,
        edit,
        dry_run=dry_run,
        env=os.environ if env is None else env,
        inventory=inventory,
        cpu_budget=cpu_budget,
    )
