"""Config -> one ReplicaSpec per worker, and the resize rules the serve/apply flags follow.

Pure logic: GPU inventory comes from an ``InventoryProvider`` and the CPU budget is a value,
so every rule of the product page's "Place and scale replicas", "What replicas share" and
"CPU threads" sections is a table test (tests/unit/test_placement_*.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_sr.config.schema import Deployment, Replica, RootConfig, device_platform
from vllm_sr.errors import PlacementError, UsageError
from vllm_sr.placement.allocation import (
    Located,
    allocation_candidates,
    locate,
    read_allocation,
    worker_env,
)
from vllm_sr.placement.auto import AUTO, resolve_auto
from vllm_sr.placement.cpu import (
    CpuBudget,
    assign_cpu_sets,
    deployment_threads,
    measure_cpu_budget,
    threads_per_worker,
)
from vllm_sr.placement.gpus import MIB, GpuInfo, query_gpus
from vllm_sr.plan import ReplicaSpec

InventoryProvider = Callable[[str], list[GpuInfo]]

# A worker holds the weights plus activations, the runtime's context and allocator slack; twice
# the weights is a conservative floor for encoder-sized models at our batch limits.
VRAM_NEED_FACTOR = 2.0
KNOWN_ARTIFACT_BYTES = {"vllm-sr/d3-edge": 90_868_376}
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


@dataclass
class Plan:
    replicas: list[ReplicaSpec]
    notes: list[str] = field(default_factory=list)

    def for_deployment(self, name: str) -> list[ReplicaSpec]:
        return [r for r in self.replicas if r.deployment == name]

    def to_json(self) -> list[dict[str, Any]]:
        return [r.to_json() for r in self.replicas]


def estimated_need_bytes(artifact: str) -> int | None:
    """VRAM one worker needs: weights x VRAM_NEED_FACTOR; None when the size is unknown."""
    weights = KNOWN_ARTIFACT_BYTES.get(artifact)
    if weights is None:
        p = Path(artifact)
        if p.is_dir():
            weights = sum(f.stat().st_size for f in p.rglob("*") if f.suffix in WEIGHT_SUFFIXES)
    return int(weights * VRAM_NEED_FACTOR) if weights else None


def real_inventory(env: Mapping[str, str]) -> InventoryProvider:
    cache: dict[str, list[GpuInfo]] = {}

    def provide(platform: str) -> list[GpuInfo]:
        if platform not in cache:
            cache[platform] = query_gpus(platform, env=env)
        return cache[platform]

    return provide


def _gpu(r: Replica) -> bool:
    return r.device is not None and r.device != "cpu"


def _locate(
    name: str, device: str | None, env: Mapping[str, str], gpus: list[GpuInfo] | None
) -> Located:
    try:
        return locate(device or "cpu", env, gpus)
    except PlacementError as exc:
        raise PlacementError(f"deployment {name}: {exc.message}") from exc


def _check_memory(where: Located, workers: int, need: int | None) -> list[str]:
    gpu = where.gpu
    if gpu is None or need is None or gpu.vram_free is None or workers * need <= gpu.vram_free:
        return []
    return [
        f"{where.device}: {workers} worker(s) x ~{need // MIB} MiB each exceed the "
        f"{gpu.vram_free // MIB} MiB free now (workers of a running service count as used)"
    ]


def plan(
    config: RootConfig,
    *,
    env: Mapping[str, str] | None = None,
    inventory_provider: InventoryProvider | None = None,
    cpu_budget: CpuBudget | None = None,
    check_gpus: bool = True,
) -> Plan:
    """One spec per replica of every deployment. ``inventory_provider`` is asked once per GPU
    platform in use (None: run rocm-smi / nvidia-smi); ``check_gpus=False`` skips it."""
    env = os.environ if env is None else env
    budget = cpu_budget or measure_cpu_budget()
    provider = inventory_provider or real_inventory(env)
    notes: list[str] = []
    config = resolve_auto(config, provider if check_gpus else None, env, notes)
    cpu_slots = [
        (n, i)
        for n, d in config.deployments.items()
        for i, r in enumerate(d.effective_replicas())
        if r.device == "cpu"
    ]
    threads: dict[str, int] = {}
    sets: list[list[int] | None] = []
    if cpu_slots:
        default, why = threads_per_worker(budget, env)
        notes.append(f"{budget.describe()}; {why}")
        for name in dict.fromkeys(n for n, _ in cpu_slots):
            threads[name], own = deployment_threads(
                budget, config.deployments[name].threads, default, env
            )
            if own:
                notes.append(f"deployment {name}: {own}")
        sets, shared = assign_cpu_sets(budget, len(cpu_slots), [threads[n] for n, _ in cpu_slots])
        if shared:
            notes.append(shared)
    cpu_of = dict(zip(cpu_slots, sets, strict=True))
    specs: list[ReplicaSpec] = []
    for name, dep in config.deployments.items():
        specs += _deployment_specs(
            name, dep, env, provider if check_gpus else None, threads.get(name, 1), cpu_of, notes
        )
    return Plan(replicas=specs, notes=notes)


def _common_fields(name: str, index: int, dep: Deployment) -> dict[str, Any]:
    """What every replica of a deployment shares (the page's "What replicas share")."""
    return dict(
        id=f"{name}-{index}",
        deployment=name,
        index=index,
        artifact=dep.artifact,
        revision=dep.revision,
        max_num_seqs=dep.engine_args.max_num_seqs,
        max_num_batched_tokens=dep.engine_args.max_num_batched_tokens,
        dtype=dep.engine_args.dtype,
        max_input_tokens=dep.input.max_tokens,
        overflow=dep.input.overflow,
        public_name=dep.public_name,
    )


def _deployment_specs(
    name: str,
    dep: Deployment,
    env: Mapping[str, str],
    provider: InventoryProvider | None,
    threads: int,
    cpu_of: dict[tuple[str, int], list[int] | None],
    notes: list[str],
) -> list[ReplicaSpec]:
    replicas = dep.effective_replicas()
    platform = dep.platform
    gpus = provider(platform) if provider and platform in ("rocm", "cuda") else None
    need = estimated_need_bytes(dep.artifact)
    where = {i: _locate(name, r.device, env, gpus) for i, r in enumerate(replicas) if _gpu(r)}
    load: dict[str, int] = {}
    for w in where.values():
        load[w.host_device] = load.get(w.host_device, 0) + 1
    specs = []
    for i, r in enumerate(replicas):
        common = _common_fields(name, i, dep)
        if r.endpoint is not None:
            specs.append(ReplicaSpec(device=None, endpoint=r.endpoint, model=r.model, **common))
        elif r.device == "cpu":
            cpus = cpu_of.get((name, i))
            spec_env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
            specs.append(
                ReplicaSpec(
                    device="cpu",
                    threads=threads,
                    env=spec_env,
                    cpus=tuple(cpus) if cpus else None,
                    **common,
                )
            )
        else:
            w = where[i]
            found = _check_memory(w, load[w.host_device], need)
            notes.extend(n for n in found if n not in notes)
            specs.append(
                ReplicaSpec(device=w.device, env=worker_env(w), host_device=w.host_device, **common)
            )
    if len(load) < sum(load.values()):
        notes.append(
            f"deployment {name}: several workers share a GPU; each holds its own copy of "
            "the weights (replicas do not shard weights)"
        )
    return specs


def available_gpus(
    gpus: Sequence[GpuInfo], need: int | None, env: Mapping[str, str], platform: str
) -> tuple[list[str], list[str]]:
    """Devices a new placement may use, in order (allocation ordinals, or host GPUs without an
    allocation) with free VRAM >= need, and why the others were skipped."""
    ok, skipped = [], []
    for device, g in allocation_candidates(platform, env, gpus):
        label = device if device == f"{platform}:{g.index}" else f"{device} (host {g.index})"
        if need is not None and g.vram_free is not None and g.vram_free < need:
            skipped.append(
                f"{label} skipped: {g.vram_free // MIB} MiB free < ~{need // MIB} MiB needed"
            )
            continue
        if need is not None and g.vram_free is None:
            skipped.append(f"{label} used without a memory check: the tool reported no free VRAM")
        ok.append(device)
    return ok, skipped


def devices_of_others(config: RootConfig, name: str) -> dict[str, list[str]]:
    """Each GPU device the deployments other than ``name`` are placed on -> those deployments
    (config order). Their workers need not be running: a placement shares a GPU with them as
    soon as both run."""
    out: dict[str, list[str]] = {}
    for other, dep in config.deployments.items():
        if other == name:
            continue
        for r in dep.effective_replicas():
            if _gpu(r) and r.device is not None and other not in out.get(r.device, []):
                out.setdefault(r.device, []).append(other)
    return out


@dataclass(frozen=True)
class PlacementRequest:
    """What the flags ask of one deployment's placement (None = keep)."""

    platform: str | None = None
    count: int | None = None
    device_ids: tuple[int, ...] | None = None


def _explicit_ids(req: PlacementRequest, platform: str, env: Mapping[str, str]) -> list[str]:
    ids = list(req.device_ids or ())
    if platform in ("cpu", AUTO):
        raise UsageError(
            f"--device-ids {','.join(map(str, ids))}: the platform is {platform}; add --platform "
            "rocm or --platform cuda, or drop --device-ids"
        )
    alloc = read_allocation(env, platform)
    if alloc is not None:
        try:
            for i in ids:
                alloc.check(i, f"{platform}:{i}")
        except PlacementError as exc:
            raise UsageError(f"--device-ids {','.join(map(str, ids))}: {exc.message}") from exc
    count = req.count or len(ids)
    if len(ids) > count:
        raise UsageError(
            f"--device-ids {','.join(map(str, ids))} names {len(ids)} GPUs for -dp {count}; "
            f"give at most {count} IDs, or raise -dp"
        )
    # Fewer IDs than workers: repeat them in order (-dp 2 --device-ids 0 = two on GPU 0).
    return [f"{platform}:{ids[i % len(ids)]}" for i in range(count)]


def _pick_gpus(
    count: int,
    keep: list[str],
    platform: str,
    gpus: Sequence[GpuInfo],
    need: int | None,
    env: Mapping[str, str],
    notes: list[str],
    others: Mapping[str, Sequence[str]],
) -> list[str]:
    """``keep`` plus the next available GPUs up to ``count``: GPUs no other deployment uses
    first, in order; a GPU another deployment uses only when the unused ones run out, with a
    note naming who shares it (``others``: device -> the deployments on it)."""
    ok, skipped = available_gpus(gpus, need, env, platform)
    notes.extend(skipped)
    used = set(keep)
    fresh = [d for d in ok if d not in used]
    missing = count - len(keep)
    if len(fresh) < missing:
        found = ", ".join(g.describe() for g in gpus) or "none"
        why = f"; {'; '.join(skipped)}" if skipped else ""
        alloc = read_allocation(env, platform)
        within = f" in the allocation ({alloc.source})" if alloc is not None else ""
        raise PlacementError(
            f"-dp {count}: needs {missing} more available {platform} GPU(s) but found "
            f"{len(fresh)}{within} ({len(gpus)} GPU(s): {found}{why}); lower -dp, free a GPU, or "
            "name GPUs with --device-ids (repeat an ID to stack workers on one GPU)"
        )
    unused = [d for d in fresh if not others.get(d)]
    picked = (unused + [d for d in fresh if others.get(d)])[:missing]
    for device in picked:
        if others.get(device):
            notes.append(
                f"{device} is shared with deployment(s) {', '.join(others[device])}: -dp "
                f"{count} needs {missing} more GPU(s) and only {len(unused)} available GPU(s) "
                "are unused by other deployments; each worker holds its own copy of its weights "
                "(name GPUs with --device-ids to choose)"
            )
    return keep + picked


def resize_placement(
    current: list[Replica],
    req: PlacementRequest,
    *,
    inventory: InventoryProvider | None,
    need: int | None,
    env: Mapping[str, str],
    others: Mapping[str, Sequence[str]] | None = None,
) -> tuple[list[Replica], list[str]]:
    """The new canonical replica list for one deployment. Authored placements resize in
    their declared order; a new GPU placement takes the first N available GPUs, preferring
    those no other deployment uses (``others``: device -> the other deployments on it, see
    :func:`devices_of_others`)."""
    notes: list[str] = []
    managed = [r for r in current if r.device is not None]
    if any(r.endpoint is not None for r in current) and (
        req.count or req.device_ids or req.platform
    ):
        raise UsageError(
            "-dp/--platform/--device-ids: this deployment has attached (endpoint) replicas, "
            "which vllm-sr does not start; edit replicas in config instead"
        )
    cur_platform = device_platform(managed[0].device) if managed else "cpu"  # type: ignore[arg-type]
    platform = req.platform or cur_platform
    if req.device_ids is not None:
        devices = _explicit_ids(req, platform, env)
    else:
        keep_all = [r.device for r in managed] if platform == cur_platform else []
        # A platform switch without -dp keeps the worker count, on new devices.
        count = req.count or len(managed) or 1
        if platform in ("cpu", AUTO):  # auto stays auto: resolved when the plan is made
            devices = [platform] * count
        else:
            keep = [d for d in keep_all[:count] if d]
            if len(keep) < count:
                gpus = inventory(platform) if inventory else []
                keep = _pick_gpus(count, keep, platform, gpus, need, env, notes, others or {})
            devices = keep
    new = [Replica(device=d) for d in devices]
    return new, notes
