"""GPU pieces of calibration: the free memory of the device and a probe forward that reports
its peak memory (only used when a worker runs on a GPU).

Every figure comes through ``CudaMemory``, the handful of ``torch.cuda`` calls the probe makes
(``torch.cuda`` itself satisfies it), so the arithmetic around them is tested on recorded
figures without a GPU (tests/unit/test_gpu_probe.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from vllm_sr.worker.calibrate import Probe

FILLER_ID = 1000  # any in-vocabulary id: a forward's memory does not depend on the values


class CudaMemory(Protocol):
    def mem_get_info(self, device: Any = None) -> tuple[int, int]: ...

    def synchronize(self, device: Any = None) -> None: ...

    def empty_cache(self) -> None: ...

    def memory_allocated(self, device: Any = None) -> int: ...

    def reset_peak_memory_stats(self, device: Any = None) -> None: ...

    def max_memory_allocated(self, device: Any = None) -> int: ...


Forward = Callable[[list[list[int]]], Any]


def free_bytes(device: Any, cuda: CudaMemory) -> int:
    """The device's free bytes now (``cudaMemGetInfo``: what the driver has left for anyone,
    so another process's allocations on the card are already taken off)."""
    free, _total = cuda.mem_get_info(device)
    return int(free)


def make_probe(
    forward: Forward,
    width: int,
    device: Any,
    cuda: CudaMemory,
    oom: tuple[type[BaseException], ...] = (MemoryError,),
) -> Probe:
    """probe(tokens): one forward of ``tokens // width`` rows of ``width`` tokens (at least
    one row); returns the peak bytes it allocated above what was resident before it. A
    forward raising one of ``oom`` becomes ``MemoryError`` (the calibration's stop signal)."""

    def probe(tokens: int) -> int:
        rows = max(1, tokens // width)
        cuda.synchronize(device)
        cuda.empty_cache()
        base = int(cuda.memory_allocated(device))
        cuda.reset_peak_memory_stats(device)
        try:
            forward([[FILLER_ID] * width for _ in range(rows)])
            cuda.synchronize(device)
        except oom:
            cuda.empty_cache()
            raise MemoryError(f"{tokens} tokens do not fit") from None
        return int(cuda.max_memory_allocated(device)) - base

    return probe


def torch_probe(loaded: Any) -> tuple[Probe, int]:
    """The real probe and free memory for a loaded artifact on a torch CUDA/ROCm device."""
    import torch

    device = loaded.torch_device
    cuda: CudaMemory = torch.cuda
    probe = make_probe(
        loaded.runner.forward,
        loaded.max_length,
        device,
        cuda,
        oom=(torch.cuda.OutOfMemoryError, MemoryError),
    )
    return probe, free_bytes(device, cuda)
