"""GPU pieces of calibration: the free memory of the device and a probe forward that reports
its peak memory (only imported when a worker runs on a GPU)."""

from __future__ import annotations

from typing import Any

from vllm_sr.worker.calibrate import Probe


def free_bytes(device: Any) -> int:
    import torch

    free, _total = torch.cuda.mem_get_info(device)
    return int(free)


def make_probe(loaded: Any) -> Probe:
    """probe(tokens): one forward of ``tokens // max_length`` rows of ``max_length`` tokens
    (at least one row); returns the peak bytes it allocated above what was resident."""
    import torch

    device = loaded.torch_device
    width = loaded.max_length
    filler = 1000  # any in-vocabulary id: the cost does not depend on the values

    def probe(tokens: int) -> int:
        rows = max(1, tokens // width)
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        try:
            loaded.runner.forward([[filler] * width for _ in range(rows)])
            torch.cuda.synchronize(device)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            raise MemoryError(f"{tokens} tokens do not fit") from None
        return int(torch.cuda.max_memory_allocated(device) - base)

    return probe
