"""Allocation ordinals of a validated config, for sizing a pod.

STAND-IN: placement is getting the real function (the devices a pod was given come from the
*_VISIBLE_DEVICES variables, and ``rocm:N`` / ``cuda:N`` are ordinals into them). Until it lands,
this module keeps the same contract so that ``vllm_sr.kube`` can switch to it by changing one
import: for a validated config, the distinct ordinals per platform, and every reference that
cannot be an ordinal.

A pod given k GPUs sees ordinals 0..k-1, and the limit asked of Kubernetes is the number of
distinct ordinals, so the ordinals a config names must be exactly 0..k-1: ``rocm:5`` in a config
naming two GPUs cannot be an ordinal; it is a host ID (for instance written by ``--device-ids``
on a host).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_sr.config.schema import RootConfig, device_index, device_platform


@dataclass(frozen=True)
class OrdinalRef:
    """One managed replica's GPU reference."""

    replica: str  # <deployment>-<index>
    device: str  # rocm:N / cuda:N as written
    platform: str
    ordinal: int


@dataclass(frozen=True)
class NotAnOrdinal:
    replica: str
    device: str
    why: str


@dataclass(frozen=True)
class AllocationOrdinals:
    by_platform: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Distinct ordinals per GPU platform, sorted."""

    refs: tuple[OrdinalRef, ...] = ()
    """Every GPU reference, in config order."""

    not_ordinals: tuple[NotAnOrdinal, ...] = ()
    """References that cannot be allocation ordinals (empty: the config is fit for a pod)."""


def allocation_ordinals(config: RootConfig) -> AllocationOrdinals:
    refs: list[OrdinalRef] = []
    for name, dep in config.deployments.items():
        for i, rep in enumerate(dep.effective_replicas()):
            dev = rep.device
            if dev is None or dev == "cpu":
                continue
            idx = device_index(dev)
            if idx is not None:
                refs.append(OrdinalRef(f"{name}-{i}", dev, device_platform(dev), idx))
    by_platform: dict[str, tuple[int, ...]] = {}
    for ref in refs:
        by_platform[ref.platform] = tuple(sorted({*by_platform.get(ref.platform, ()), ref.ordinal}))
    bad = []
    for ref in refs:
        count = len(by_platform[ref.platform])
        if ref.ordinal >= count:
            bad.append(
                NotAnOrdinal(
                    ref.replica,
                    ref.device,
                    f"the config names {count} distinct {ref.platform} GPU(s), so the pod is "
                    f"given {count} and its ordinals are 0..{count - 1}",
                )
            )
    return AllocationOrdinals(by_platform, tuple(refs), tuple(bad))
