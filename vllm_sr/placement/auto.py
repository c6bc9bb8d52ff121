"""``device: auto`` (upstream v0.4): before planning, each auto replica becomes a GPU the
inventory lists (CUDA first, then ROCm; auto replicas of one deployment spread over its GPUs in
order), or ``cpu`` when no platform lists one. Pure: the inventory is a provider."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from vllm_sr.config.schema import Deployment, RootConfig
from vllm_sr.errors import PlacementError
from vllm_sr.placement.allocation import allocation_candidates
from vllm_sr.placement.gpus import GpuInfo

AUTO = "auto"
AUTO_PLATFORMS = ("cuda", "rocm")


def auto_devices(
    provider: Callable[[str], list[GpuInfo]] | None, env: Mapping[str, str]
) -> tuple[list[str], str]:
    """The devices auto may use (the allocation's ordinals when the process was given GPUs,
    else the host GPUs the tool lists), and the sentence that says why. ``provider`` None (GPU
    checks off): cpu."""
    if provider is None:
        return ["cpu"], "device auto: GPU inventory not checked; planned on cpu"
    seen: list[str] = []
    for platform in AUTO_PLATFORMS:
        try:
            gpus = provider(platform)
        except PlacementError as exc:
            seen.append(exc.message)
            continue
        devices = [d for d, _ in allocation_candidates(platform, env, gpus)] if gpus else []
        if devices:
            return devices, f"device auto: {platform} GPUs {', '.join(devices)}"
    return ["cpu"], "device auto: no GPU in the inventory (" + "; ".join(seen) + "); on cpu"


def _resolved(dep: Deployment, devices: list[str]) -> Deployment:
    replicas = dep.effective_replicas()
    if not any(r.device == AUTO for r in replicas):
        return dep
    new = [
        r.model_copy(update={"device": devices[i % len(devices)]}) if r.device == AUTO else r
        for i, r in enumerate(replicas)
    ]
    return dep.model_copy(update={"replicas": new, "device": None})


def resolve_auto(
    config: RootConfig,
    provider: Callable[[str], list[GpuInfo]] | None,
    env: Mapping[str, str],
    notes: list[str],
) -> RootConfig:
    """``config`` with every auto device resolved (unchanged, and no inventory asked, when no
    replica says auto)."""
    uses_auto = any(
        r.device == AUTO for d in config.deployments.values() for r in d.effective_replicas()
    )
    if not uses_auto:
        return config
    devices, why = auto_devices(provider, env)
    notes.append(why)
    deployments = {n: _resolved(d, devices) for n, d in config.deployments.items()}
    catalog = config.global_.model_catalog.model_copy(update={"deployments": deployments})
    global_ = config.global_.model_copy(update={"model_catalog": catalog})
    return config.model_copy(update={"global_": global_})
