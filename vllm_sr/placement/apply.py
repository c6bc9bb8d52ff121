"""Flags -> the canonical resource: the flag edits of config.yaml, planned and written
atomically.

``vllm-sr config apply``, ``vllm-sr serve`` and the control API's scale all come through here,
so the file is the only state: there is no separate data-parallel setting anywhere. Placement
owns these edits (they need the GPU inventory and the CPU budget); ``vllm_sr.config.edit`` owns
how a value is written into the operator's document, and ``vllm_sr.placement.render`` prints
the result.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_sr.config.edit import child, deployment_doc, set_key, set_threads, write_replicas
from vllm_sr.config.files import (
    atomic_write,
    directory_lock,
    dump_document,
    parse_config,
    parse_document,
    read_config_text,
)
from vllm_sr.config.flags import DeploymentFlags
from vllm_sr.config.schema import (
    DEFAULT_DEPLOYMENT,
    MAX_REPLICAS,
    RootConfig,
    embedded_default_deployments,
)
from vllm_sr.errors import NotFound, UsageError
from vllm_sr.placement.artifacts import check_artifacts
from vllm_sr.placement.cpu import CpuBudget
from vllm_sr.placement.planner import (
    InventoryProvider,
    PlacementRequest,
    Plan,
    devices_of_others,
    estimated_need_bytes,
    plan,
    real_inventory,
    resize_placement,
)

__all__ = ["ApplyResult", "apply_flags", "apply_scale"]


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


@dataclass(frozen=True)
class _Edit:
    deployment: str | None
    artifact: str | None = None
    engine: bool = False
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    dtype: str | None = None
    threads: int | None = None
    placement: PlacementRequest = field(default_factory=PlacementRequest)


def _is_noop(edit: _Edit) -> bool:
    return edit == _Edit(deployment=edit.deployment)


def _edit_document(
    doc: Any,
    current: RootConfig,
    name: str,
    edit: _Edit,
    provider: InventoryProvider,
    env: Mapping[str, str],
) -> list[str]:
    """Apply ``edit`` to the round-trip document in place; returns the placement notes. An
    edit that asks for nothing leaves the document alone (``serve`` with no deployment flags
    on a file that declares no deployment keeps running the embedded default unwritten)."""
    if _is_noop(edit):
        return []
    dep = current.deployments.get(name) or embedded_default_deployments()[name]
    dep_doc = deployment_doc(doc, name)
    if edit.artifact is not None:
        set_key(dep_doc, "artifact", edit.artifact)
    if edit.engine:
        set_key(child(doc["global"], "router"), "enabled", False)
    for key in ("max_num_seqs", "max_num_batched_tokens", "dtype"):
        if getattr(edit, key) is not None:
            set_key(child(dep_doc, "engine_args"), key, getattr(edit, key))
    if edit.threads is not None:
        set_threads(dep_doc, edit.threads)
    req = edit.placement
    if req.platform is None and req.count is None and req.device_ids is None:
        return []
    need = estimated_need_bytes(edit.artifact or dep.artifact)
    current_replicas = dep.effective_replicas()
    others = devices_of_others(current, name)
    new, notes = resize_placement(
        current_replicas, req, inventory=provider, need=need, env=env, others=others
    )
    if [r.model_dump() for r in new] != [r.model_dump() for r in current_replicas]:
        write_replicas(dep_doc, new)
    return notes


def _edit_and_finish(
    config_path: Path | str,
    edit: _Edit,
    *,
    dry_run: bool,
    env: Mapping[str, str] | None,
    inventory: InventoryProvider | None,
    cpu_budget: CpuBudget | None,
    artifacts_dir: Path | None = None,
) -> ApplyResult:
    path = Path(config_path)
    env = os.environ if env is None else env
    provider = inventory or real_inventory(env)
    with directory_lock(path.parent, exclusive=not dry_run):
        old_text, existed = read_config_text(path)
        current = parse_config(old_text, str(path))
        doc = parse_document(old_text, str(path))
        name = edit.deployment or current.default_deployment()
        # With no deployment declared, a flag edits the embedded default (written out first).
        if name not in current.deployments and (current.deployments or name != DEFAULT_DEPLOYMENT):
            raise NotFound(
                f"deployment {name!r} is not in {path}; accepted: {', '.join(current.deployments)}"
            )
        notes = _edit_document(doc, current, name, edit, provider, env)
        # Nothing asked: the operator's file stays byte for byte (a re-dump may reformat it).
        new_text = old_text if existed and _is_noop(edit) else dump_document(doc)
        config = parse_config(new_text, str(path))
        if artifacts_dir is not None:
            check_artifacts(config, new_text, str(path), artifacts_dir)
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
    artifacts_dir: Path | None = None,
) -> ApplyResult:
    """Write what the flags describe into the canonical resource (the decision model's
    deployment) and plan it. MODEL alone keeps replicas and engine arguments. With
    ``artifacts_dir``, an artifact a worker could not load here is refused (ConfigError) and
    nothing is written."""
    edit = _Edit(
        deployment=None,
        artifact=flags.model,
        engine=flags.engine,
        max_num_seqs=flags.max_num_seqs,
        max_num_batched_tokens=flags.max_num_batched_tokens,
        dtype=flags.dtype,
        threads=flags.threads,
        placement=PlacementRequest(
            platform=flags.platform, count=flags.data_parallel_size, device_ids=flags.device_ids
        ),
    )
    return _edit_and_finish(
        config_path,
        edit,
        dry_run=dry_run,
        env=env,
        inventory=inventory,
        cpu_budget=cpu_budget,
        artifacts_dir=artifacts_dir,
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
        env=env,
        inventory=inventory,
        cpu_budget=cpu_budget,
    )
