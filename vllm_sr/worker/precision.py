"""The precision a worker's forward runs in: ``engine_args.dtype`` (``auto``, ``float32``,
``bfloat16``, ``float16``) resolved against what the device can do fast.

``auto`` resolves per host: on a GPU, bfloat16 where the device has it natively, else float16;
on a CPU, bfloat16 when the CPU has native bf16 matrix instructions (AMX or AVX512-BF16, as
torch's own cpuinfo probes report them; oneDNN picks its bf16 kernels from the same bits), else
float32 (without them oneDNN emulates bf16, slower than float32). An explicit value is honoured
as asked; one the device runs slowly (float16 on a CPU, bfloat16 on a CPU without native bf16 or
on a GPU without it) carries a warning, never a silent change.

The facts about a device come through ``DeviceFacts``, gathered by ``cpu_facts`` and
``gpu_facts`` from whatever object stands for ``torch`` (the real module, or a fake in the
tests), so the resolution rules are tested on fakes without a GPU.

The forward runs under ``torch.autocast`` at the resolved dtype (matrix products run in the lower
precision, normalisations and softmax in float32; only the linear layers' weights are held at the
lower precision, cast once at load: ``runner.TorchRunner.precast_linears``), so a bfloat16 worker
stays closer to float32 answers than a model cast whole would (docs/worker.md has the margins).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from vllm_sr.errors import ArtifactError

DType = Literal["auto", "float32", "bfloat16", "float16"]
DTYPES: tuple[str, ...] = ("auto", "float32", "bfloat16", "float16")
SERVED_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class DeviceFacts:
    """What decides ``auto``: the platform, whether bf16 / fp16 matrix work is native there,
    and the words that say why (the worker's ready line carries them)."""

    platform: str  # cpu, cuda or rocm
    bf16_native: bool
    fp16_native: bool
    detail: str  # e.g. "AMD EPYC: AVX512-BF16" or "NVIDIA H100 (compute 9.0)"


@dataclass(frozen=True)
class Resolution:
    requested: str
    dtype: str  # float32, bfloat16 or float16: what the forward runs in
    reason: str  # why this dtype, for the ready line and /v1/models
    warning: str | None = None  # an explicit choice the device runs slowly

    def to_json(self) -> dict[str, Any]:
        return {
            "requested": self.requested,
            "dtype": self.dtype,
            "reason": self.reason,
            "warning": self.warning,
        }


def check_requested(requested: str) -> str:
    if requested not in DTYPES:
        raise ArtifactError(
            f"dtype {requested!r} is not accepted; accepted: {', '.join(DTYPES)}",
            dtype=requested,
        )
    return requested


def resolve(requested: str, facts: DeviceFacts) -> Resolution:
    """The served dtype for ``requested`` on a device described by ``facts`` (pure)."""
    check_requested(requested)
    gpu = facts.platform != "cpu"
    if requested == "auto":
        if gpu:
            if facts.bf16_native:
                return Resolution(requested, "bfloat16", f"auto: {facts.detail} has bfloat16")
            return Resolution(
                requested, "float16", f"auto: {facts.detail} has no native bfloat16; float16"
            )
        if facts.bf16_native:
            return Resolution(requested, "bfloat16", f"auto: native bf16 on {facts.detail}")
        return Resolution(requested, "float32", f"auto: no native bf16 on {facts.detail}; float32")
    warning = None
    if requested == "float16" and not gpu:
        warning = (
            "float16 on a CPU runs slowly (no fast float16 matrix kernels there); auto would "
            f"serve {'bfloat16' if facts.bf16_native else 'float32'}"
        )
    elif requested == "bfloat16" and not facts.bf16_native:
        warning = (
            f"bfloat16 without native support ({facts.detail}) is emulated and slow; auto "
            f"would serve {'float16' if gpu else 'float32'}"
        )
    return Resolution(requested, requested, f"configured, on {facts.detail}", warning)


def _ask(namespace: Any, name: str, *args: Any, **kwargs: Any) -> bool:
    """A torch capability probe that may be missing in this torch build: missing is False."""
    fn = getattr(namespace, name, None)
    if fn is None:
        return False
    try:
        return bool(fn(*args, **kwargs))
    except (RuntimeError, TypeError, AssertionError):
        return False


def cpu_facts(torch: Any, cpu_model: str = "") -> DeviceFacts:
    """Native bf16 on this CPU, from torch's cpuinfo probes (``torch.cpu._is_amx_tile_supported``,
    ``_is_avx512_bf16_supported``) and oneDNN's presence (``torch.backends.mkldnn``);
    float16 is never native here for our purpose (AMX-FP16 aside, which torch's autocast does
    not pick for these models)."""
    amx = _ask(torch.cpu, "_is_amx_tile_supported")
    avx = _ask(torch.cpu, "_is_avx512_bf16_supported")
    onednn = _ask(torch.backends.mkldnn, "is_available")
    found = [name for name, has in (("AMX", amx), ("AVX512-BF16", avx)) if has]
    head = f"{cpu_model}: " if cpu_model else "this CPU: "
    if found and onednn:
        detail = head + " and ".join(found) + ", oneDNN bf16 kernels"
    elif found:
        detail = head + " and ".join(found) + ", but torch has no oneDNN"
    else:
        detail = head + "no AMX, no AVX512-BF16"
    return DeviceFacts("cpu", bool(found) and onednn, False, detail)


def gpu_facts(torch: Any, index: int = 0) -> DeviceFacts:
    """bf16 on CUDA or ROCm as torch reports it, without counting emulation (a pre-Ampere
    NVIDIA GPU runs bf16 emulated, slower than float16)."""
    cuda = torch.cuda
    rocm = bool(getattr(torch.version, "hip", None))
    try:
        name = str(cuda.get_device_name(index))
        major, minor = cuda.get_device_capability(index)
    except (RuntimeError, AssertionError) as exc:
        raise ArtifactError(f"cannot read GPU {index}'s properties: {exc}") from None
    try:
        bf16 = bool(cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # an older torch without the keyword
        bf16 = _ask(cuda, "is_bf16_supported") and (rocm or major >= 8)
    arch = f"gfx {major}.{minor}" if rocm else f"compute {major}.{minor}"
    return DeviceFacts("rocm" if rocm else "cuda", bf16, True, f"{name} ({arch})")


def cpu_model_name(cpuinfo_path: str = "/proc/cpuinfo") -> str:
    try:
        with open(cpuinfo_path, errors="replace") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return ""


def facts_for(device: str) -> DeviceFacts:
    """The facts of ``device`` (cpu, cuda:N, rocm:N) from the real torch."""
    import torch

    if device == "cpu":
        return cpu_facts(torch, cpu_model_name())
    _, _, index = device.partition(":")
    return gpu_facts(torch, int(index or 0))


def torch_dtype(name: str) -> Any:
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
