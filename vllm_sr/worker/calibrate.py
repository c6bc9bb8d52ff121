"""Startup calibration of the batch limits a deployment leaves unset.

CPU: documented defaults (a CPU forward gains little from rows past a few dozen, and 8192
padded tokens keeps one forward of the longest inputs well under a second on small encoders).
GPU: the largest padded-token budget, found by doubling probe forwards, whose measured peak
memory plus ``GPU_HEADROOM`` of it still fits in the device's free memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vllm_sr.errors import ArtifactError
from vllm_sr.worker.engine_types import Limits

CPU_MAX_NUM_SEQS = 64
CPU_MAX_NUM_BATCHED_TOKENS = 8192
GPU_MAX_NUM_SEQS = 256
GPU_HEADROOM = 0.25  # keep a quarter of the peak on top free for fragmentation and other use
GPU_MAX_NUM_BATCHED_TOKENS = 262_144  # probing stops here

# probe(tokens) runs a forward of about ``tokens`` padded tokens and returns its peak bytes;
# it raises MemoryError when the forward does not fit at all.
Probe = Callable[[int], int]


@dataclass(frozen=True)
class Calibration:
    limits: Limits
    source: dict[str, str]  # field -> "configured" | "cpu default" | "calibrated"
    probes: list[tuple[int, int | None]]  # (tokens, peak bytes or None when it failed)


def calibrate(
    *,
    device_kind: str,
    max_length: int,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    probe: Probe | None = None,
    free_bytes: int | None = None,
) -> Calibration:
    source: dict[str, str] = {}
    probes: list[tuple[int, int | None]] = []
    gpu = device_kind in ("cuda", "rocm")
    if max_num_seqs is not None:
        seqs = max_num_seqs
        source["max_num_seqs"] = "configured"
    else:
        seqs = GPU_MAX_NUM_SEQS if gpu else CPU_MAX_NUM_SEQS
        source["max_num_seqs"] = "gpu default" if gpu else "cpu default"
    if max_num_batched_tokens is not None:
        tokens = max_num_batched_tokens
        source["max_num_batched_tokens"] = "configured"
    elif not gpu:
        tokens = max(CPU_MAX_NUM_BATCHED_TOKENS, max_length)
        source["max_num_batched_tokens"] = "cpu default"
    else:
        if probe is None or free_bytes is None:
            raise ArtifactError("GPU calibration needs a probe and the free memory")
        tokens = gpu_token_budget(probe, free_bytes, max_length, probes)
        source["max_num_batched_tokens"] = "calibrated"
    return Calibration(Limits(seqs, tokens), source, probes)


def gpu_token_budget(
    probe: Probe,
    free_bytes: int,
    max_length: int,
    record: list[tuple[int, int | None]] | None = None,
) -> int:
    """Double the probed budget from one longest row while its peak, with headroom, fits."""
    record = record if record is not None else []
    best: int | None = None
    tokens = max_length
    while tokens <= GPU_MAX_NUM_BATCHED_TOKENS:
        try:
            peak = probe(tokens)
        except MemoryError:
            record.append((tokens, None))
            break
        record.append((tokens, peak))
        if peak * (1.0 + GPU_HEADROOM) > free_bytes:
            break
        best = tokens
        tokens *= 2
    if best is None:
        raise ArtifactError(
            f"the device cannot fit one forward of {max_length} tokens with "
            f"{int(GPU_HEADROOM * 100)}% headroom ({free_bytes} bytes free)"
        )
    return best
