"""The GPUs this process was given, and what ``rocm:N`` / ``cuda:N`` mean.

A container, a Kubernetes pod or a systemd unit with ``DeviceAllow`` hands a process a set of
GPUs and says which in the visible-devices variables: ``ROCR_VISIBLE_DEVICES`` (then
``HIP_VISIBLE_DEVICES``, an index into ROCr's view when both are set) for ROCm,
``CUDA_VISIBLE_DEVICES`` (else ``NVIDIA_VISIBLE_DEVICES``, the container runtime's) for CUDA.
When one is set, that list is the **allocation** and every ``rocm:N`` / ``cuda:N``, in config and
in flags alike, is an **ordinal** into it: ``ROCR_VISIBLE_DEVICES=3,5`` makes ``rocm:0`` host GPU
3 and ``rocm:1`` host GPU 5. Inside a Kubernetes pod with no such variable the allocation is the
GPUs the vendor tool lists there. Without either, N is the host GPU index the tool reports.

There are no host IDs under an allocation: an N past its end is refused with the allocation
named. Pure functions of the environment and an inventory (no tool is run here).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vllm_sr.config.schema import RootConfig, device_index, device_platform
from vllm_sr.errors import PlacementError
from vllm_sr.placement.gpus import TOOLS, GpuInfo

VISIBLE_VARS = {
    "rocm": ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"),
    "cuda": ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"),
}
_NONE = {"", "none", "void", "-1"}
_UUID = re.compile(r"^(GPU-[0-9A-Fa-f-]+|0x[0-9A-Fa-f]+)$")
ACCEPTED = "comma-separated device indices (3,5), GPU UUIDs (GPU-...), all, or none (no GPU)"


def in_kubernetes(env: Mapping[str, str]) -> bool:
    return bool(env.get("KUBERNETES_SERVICE_HOST"))


@dataclass(frozen=True)
class Allocation:
    """The devices one platform's ordinals index. ``entries`` name each ordinal's GPU as the
    variable did (a host index or a UUID); None = the GPUs the tool lists (a pod without a
    variable)."""

    platform: str
    source: str
    entries: tuple[str, ...] | None

    def describe(self) -> str:
        return self.source

    def check(self, ordinal: int, device: str, count: int | None = None) -> None:
        """Refuse an ordinal past the allocation's end, naming the allocation."""
        size = len(self.entries) if self.entries is not None else count
        if size is None or ordinal < size:
            return
        if size == 0:
            raise PlacementError(
                f"device {device}: the allocation ({self.source}) gives this process no "
                f"{self.platform} GPU; accepted: --platform cpu, or run with GPUs allocated"
            )
        listed = "" if self.entries is None else f": {self.ordinal_map()}"
        raise PlacementError(
            f"device {device}: ordinal {ordinal} is outside the allocation ({self.source}, "
            f"{size} GPU(s){listed}); accepted: {self.platform}:0..{self.platform}:{size - 1} "
            "(under an allocation N is an ordinal, never a host GPU ID)"
        )

    def ordinal_map(self) -> str:
        entries = self.entries or ()
        return ", ".join(
            f"{self.platform}:{i} = {'host ' if e.isdigit() else ''}{e}"
            for i, e in enumerate(entries)
        )


def _entries(name: str, value: str) -> tuple[str, ...] | None:
    """One variable's list; None for ``all`` (no restriction), () for none."""
    text = value.strip()
    if text.lower() == "all":
        return None
    if text.lower() in _NONE:
        return ()
    parts = [p.strip() for p in text.split(",")]
    for p in parts:
        if p.upper().startswith("MIG-"):
            raise PlacementError(
                f"{name}={value}: {p} is a MIG instance; vllm-sr places whole GPUs, so the "
                f"allocation must name GPUs; accepted: {ACCEPTED}"
            )
        if not (p.isdigit() or _UUID.match(p)):
            raise PlacementError(
                f"{name}={value}: entry {p!r} is not accepted; accepted: {ACCEPTED}"
            )
    dup = sorted({p for p in parts if parts.count(p) > 1})
    if dup:
        raise PlacementError(
            f"{name}={value}: {', '.join(dup)} listed twice; accepted: each device once"
        )
    return tuple(parts)


def _compose(
    outer: str, outer_list: tuple[str, ...], inner: str, inner_list: tuple[str, ...]
) -> tuple[str, ...]:
    """HIP_VISIBLE_DEVICES indexes the view ROCR_VISIBLE_DEVICES left (ROCm filters in that
    order); a UUID in the inner list names the GPU itself."""
    out = []
    for e in inner_list:
        if not e.isdigit():
            out.append(e)
        elif int(e) < len(outer_list):
            out.append(outer_list[int(e)])
        else:
            raise PlacementError(
                f"{inner}: index {e} is outside {outer}={','.join(outer_list)} "
                f"({len(outer_list)} GPU(s)); accepted: 0..{len(outer_list) - 1}"
            )
    return tuple(out)


def read_allocation(env: Mapping[str, str], platform: str) -> Allocation | None:
    """The allocation for ``platform`` from the environment; None = N is a host index."""
    if platform not in VISIBLE_VARS:
        return None
    first, second = VISIBLE_VARS[platform]
    lists = {n: _entries(n, env[n]) for n in (first, second) if n in env}
    given = {n: v for n, v in lists.items() if v is not None}
    src = {n: f"{n}={env[n].strip()}" for n in lists}
    if platform == "rocm" and len(given) == 2:
        entries = _compose(first, given[first], second, given[second])
        return Allocation(platform, f"{src[second]} over {src[first]}", entries)
    for name in (first, second):  # CUDA_VISIBLE_DEVICES is what this process's CUDA honours
        if name in given:
            return Allocation(platform, src[name], given[name])
    if in_kubernetes(env):
        tool = TOOLS.get(platform, platform)
        return Allocation(platform, f"the GPUs {tool} lists in this Kubernetes pod", None)
    return None


def _norm(uid: str) -> str:
    u = uid.strip().lower()
    for prefix in ("gpu-", "0x"):
        u = u.removeprefix(prefix)
    return u.replace("-", "")


@dataclass(frozen=True)
class Located:
    """Where one ``rocm:N`` / ``cuda:N`` lands. ``host_device`` names the GPU as the tool lists
    it (the key of :func:`vllm_sr.placement.gpus.gpu_usage`); ``entry`` is what the worker's
    visible-devices variable gets."""

    device: str
    ordinal: int | None
    entry: str
    host_device: str
    gpu: GpuInfo | None
    allocation: Allocation | None
    from_runtime_var: bool = False  # NVIDIA_VISIBLE_DEVICES: the container runtime's variable


def _match(alloc: Allocation, entry: str, gpus: Sequence[GpuInfo]) -> GpuInfo | None:
    if entry.isdigit():
        listed = {g.index: g for g in gpus}
        digits = [int(e) for e in alloc.entries or () if e.isdigit()]
        if all(d in listed for d in digits):
            return listed[int(entry)]
        if len(gpus) == len(alloc.entries or ()):
            # The runtime already hid the rest and renumbered what it left in bus order, so
            # the k-th smallest host index is the k-th GPU the tool lists.
            return sorted(gpus, key=lambda g: g.index)[sorted(digits).index(int(entry))]
    else:
        wanted = _norm(entry)
        found = [g for g in gpus if g.unique_id and _norm(g.unique_id).startswith(wanted)]
        if len(found) == 1:
            return found[0]
    listed_ids = ", ".join(f"{g.index} ({g.unique_id or 'no UUID'})" for g in gpus) or "none"
    raise PlacementError(
        f"{alloc.source}: entry {entry} matches none of the GPUs "
        f"{TOOLS.get(alloc.platform, 'the tool')} lists ({listed_ids}); accepted: indices or "
        "UUIDs of GPUs the tool lists"
    )


def locate(device: str, env: Mapping[str, str], gpus: Sequence[GpuInfo] | None = None) -> Located:
    """``rocm:N`` / ``cuda:N`` -> the GPU it means here. ``gpus`` (the tool's listing, or None
    to skip the check) resolves UUIDs and checks that the GPU exists."""
    platform, n = device_platform(device), device_index(device) or 0
    alloc = read_allocation(env, platform)
    if alloc is None:
        gpu = None
        if gpus is not None:
            gpu = next((g for g in gpus if g.index == n), None)
            if gpu is None:
                found = ", ".join(g.describe() for g in gpus) or "none"
                raise PlacementError(
                    f"device {device} does not exist; {len(gpus)} GPU(s) found: {found}"
                )
        return Located(device, None, str(n), device, gpu, None)
    alloc.check(n, device, None if gpus is None else len(gpus))
    gpu = None
    if alloc.entries is None:
        entry = str(n)
        if gpus is not None:
            gpu = sorted(gpus, key=lambda g: g.index)[n]
            entry = str(gpu.index)
    else:
        entry = alloc.entries[n]
        gpu = _match(alloc, entry, gpus) if gpus is not None else None
    host = f"{platform}:{gpu.index}" if gpu else f"{platform}:{entry}"
    runtime_var = alloc.source.startswith("NVIDIA_VISIBLE_DEVICES")
    return Located(device, n, entry, host, gpu, alloc, runtime_var)


def worker_env(where: Located) -> dict[str, str]:
    """The env that shows a worker exactly its one GPU (inside, it is always device 0)."""
    platform = device_platform(where.device)
    if platform == "rocm":
        # ROCr filters first and renumbers from 0, then HIP filters that view: naming the
        # GPU in both would pick a device that no longer exists in the HIP view.
        return {"ROCR_VISIBLE_DEVICES": where.entry, "HIP_VISIBLE_DEVICES": "0"}
    target = where.entry
    if where.from_runtime_var:
        # NVIDIA_VISIBLE_DEVICES names host GPUs, but CUDA inside the container numbers only
        # the ones it was given: the UUID means the same GPU on both sides.
        uid = where.gpu.unique_id if where.gpu else None
        target = uid or (str(where.gpu.index) if where.gpu else where.entry)
    # CUDA numbers fastest-first by default; nvidia-smi and our indices are PCI bus order.
    return {"CUDA_VISIBLE_DEVICES": target, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def allocation_candidates(
    platform: str, env: Mapping[str, str], gpus: Sequence[GpuInfo]
) -> list[tuple[str, GpuInfo]]:
    """What a new placement (``-dp`` without IDs) may pick, in order: every ordinal of the
    allocation, or every host GPU the tool lists."""
    alloc = read_allocation(env, platform)
    if alloc is None:
        return [(f"{platform}:{g.index}", g) for g in gpus]
    size = len(alloc.entries) if alloc.entries is not None else len(gpus)
    out = []
    for n in range(size):
        where = locate(f"{platform}:{n}", env, gpus)
        if where.gpu is not None:
            out.append((where.device, where.gpu))
    return out


@dataclass(frozen=True)
class DeviceOrdinals:
    """For a renderer that allocates GPUs (Kubernetes, issue 17): the distinct ordinals each
    GPU platform uses, and the references that cannot be allocation ordinals."""

    ordinals: dict[str, tuple[int, ...]]
    not_ordinals: tuple[str, ...]

    @property
    def gpus_needed(self) -> dict[str, int]:
        """GPUs to request per platform: an allocation of k GPUs has ordinals 0..k-1."""
        return {p: max(o) + 1 for p, o in self.ordinals.items() if o}

    @property
    def all_ordinals(self) -> bool:
        return not self.not_ordinals


def device_ordinals(config: RootConfig) -> DeviceOrdinals:
    """Every ``rocm:N`` / ``cuda:N`` of a validated config read as an allocation ordinal.
    Ordinals are dense from 0, so a platform whose ordinals leave a gap (``rocm:3`` with no
    ``rocm:0``..``rocm:2``) was written with host IDs: each reference past the first gap is
    listed (``primary.replicas[1].device=rocm:3``) in ``not_ordinals``."""
    used: dict[str, set[int]] = {}
    refs: list[tuple[str, int, str]] = []
    for name, dep in config.deployments.items():
        for i, r in enumerate(dep.effective_replicas()):
            if r.device is None or r.device == "cpu":
                continue
            platform, n = device_platform(r.device), device_index(r.device) or 0
            used.setdefault(platform, set()).add(n)
            refs.append((platform, n, f"{name}.replicas[{i}].device={r.device}"))
    dense = {p: _dense_prefix(s) for p, s in used.items()}
    bad = tuple(ref for platform, n, ref in refs if n >= dense[platform])
    return DeviceOrdinals({p: tuple(sorted(s)) for p, s in sorted(used.items())}, bad)


def _dense_prefix(ordinals: set[int]) -> int:
    k = 0
    while k in ordinals:
        k += 1
    return k


def describe_devices(
    config: RootConfig,
    env: Mapping[str, str],
    inventory: Callable[[str], list[GpuInfo]] | None = None,
) -> list[dict[str, Any]]:
    """One row per GPU replica for ``vllm-sr config show``: the configured device, its ordinal
    (None without an allocation), the host GPU it lands on and the allocation. The tool runs
    (``inventory``) only where the environment alone cannot say (UUIDs, a pod's listing); a
    device that cannot be placed gets a ``problem`` instead of a host."""
    rows: list[dict[str, Any]] = []
    listings: dict[str, list[GpuInfo] | None] = {}
    for name, dep in config.deployments.items():
        for i, r in enumerate(dep.effective_replicas()):
            if r.device is None or r.device == "cpu":
                continue
            row: dict[str, Any] = {"replica": f"{name}-{i}", "device": r.device}
            if r.device == "auto":  # placement/auto.py chooses when the service plans
                rows.append({**row, "ordinal": None, "host_device": None, "allocation": None})
                continue
            platform = device_platform(r.device)
            if platform not in listings:
                listings[platform] = _listing_if_needed(platform, env, inventory)
            try:
                where = locate(r.device, env, listings[platform])
            except PlacementError as exc:
                alloc = read_allocation(env, platform)
                rows.append(
                    {**row, "allocation": alloc.source if alloc else None, "problem": exc.message}
                )
                continue
            rows.append(
                {
                    **row,
                    "ordinal": where.ordinal,
                    "host_device": where.host_device,
                    "allocation": where.allocation.source if where.allocation else None,
                }
            )
    return rows


def _listing_if_needed(
    platform: str, env: Mapping[str, str], inventory: Callable[[str], list[GpuInfo]] | None
) -> list[GpuInfo] | None:
    alloc = read_allocation(env, platform)
    if alloc is None or inventory is None:
        return None
    if alloc.entries is not None and all(e.isdigit() for e in alloc.entries):
        return None
    try:
        return inventory(platform)
    except PlacementError:
        return None
