"""engine_args.dtype resolved per device (vllm_sr/worker/precision.py), on fake torch modules:
``auto`` gives bfloat16 on a CPU with AMX or AVX512-BF16 and float32 without; bfloat16 on a GPU
that has it, float16 on one that has not (CUDA and ROCm); explicit values are honoured, slow ones
warned about."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from vllm_sr.errors import ArtifactError
from vllm_sr.worker import precision
from vllm_sr.worker.precision import DeviceFacts, cpu_facts, gpu_facts, resolve


def fake_cpu_torch(*, amx: bool = False, avx512_bf16: bool = False, mkldnn: bool = True) -> Any:
    return SimpleNamespace(
        cpu=SimpleNamespace(
            _is_amx_tile_supported=lambda: amx,
            _is_avx512_bf16_supported=lambda: avx512_bf16,
        ),
        backends=SimpleNamespace(mkldnn=SimpleNamespace(is_available=lambda: mkldnn)),
    )


def fake_gpu_torch(
    name: str, capability: tuple[int, int], bf16: bool, *, hip: str | None = None
) -> Any:
    calls: list[dict[str, Any]] = []

    def is_bf16_supported(**kwargs: Any) -> bool:
        calls.append(kwargs)
        return bf16

    cuda = SimpleNamespace(
        get_device_name=lambda i: name,
        get_device_capability=lambda i: capability,
        is_bf16_supported=is_bf16_supported,
        calls=calls,
    )
    return SimpleNamespace(cuda=cuda, version=SimpleNamespace(hip=hip))


@pytest.mark.parametrize(
    ("amx", "avx", "named"),
    [(True, False, "AMX"), (False, True, "AVX512-BF16"), (True, True, "AMX and AVX512-BF16")],
)
def test_auto_on_a_cpu_with_native_bf16_is_bfloat16_and_says_why(
    amx: bool, avx: bool, named: str
) -> None:
    facts = cpu_facts(fake_cpu_torch(amx=amx, avx512_bf16=avx), "Intel Xeon")
    r = resolve("auto", facts)
    assert (r.dtype, r.warning) == ("bfloat16", None)
    assert named in r.reason and "Intel Xeon" in r.reason and r.reason.startswith("auto")


def test_auto_on_a_cpu_without_native_bf16_stays_float32() -> None:
    r = resolve("auto", cpu_facts(fake_cpu_torch(), "AMD EPYC 7B12"))
    assert r.dtype == "float32" and "no native bf16" in r.reason and r.warning is None


def test_bf16_bits_without_onednn_are_not_native() -> None:
    facts = cpu_facts(fake_cpu_torch(avx512_bf16=True, mkldnn=False))
    assert not facts.bf16_native and "no oneDNN" in facts.detail
    assert resolve("auto", facts).dtype == "float32"


def test_a_torch_without_the_probes_counts_as_no_native_bf16() -> None:
    bare = SimpleNamespace(
        cpu=SimpleNamespace(), backends=SimpleNamespace(mkldnn=SimpleNamespace())
    )
    assert resolve("auto", cpu_facts(bare)).dtype == "float32"


@pytest.mark.parametrize(
    ("torch", "platform", "dtype"),
    [
        (fake_gpu_torch("NVIDIA H100 80GB HBM3", (9, 0), True), "cuda", "bfloat16"),
        (fake_gpu_torch("NVIDIA A10", (8, 6), True), "cuda", "bfloat16"),
        (fake_gpu_torch("Tesla T4", (7, 5), False), "cuda", "float16"),
        (fake_gpu_torch("AMD Instinct MI300X", (9, 4), True, hip="6.2"), "rocm", "bfloat16"),
        (fake_gpu_torch("AMD Radeon VII", (9, 0), False, hip="6.0"), "rocm", "float16"),
    ],
)
def test_auto_on_gpus_is_bfloat16_where_supported_else_float16(
    torch: Any, platform: str, dtype: str
) -> None:
    facts = gpu_facts(torch, 0)
    assert facts.platform == platform
    r = resolve("auto", facts)
    assert r.dtype == dtype and r.warning is None
    assert torch.cuda.get_device_name(0) in r.reason
    # Emulated bf16 (a pre-Ampere GPU) must not count as support.
    assert torch.cuda.calls == [{"including_emulation": False}]


def test_an_older_torch_without_the_emulation_keyword_still_excludes_pre_ampere() -> None:
    cuda = SimpleNamespace(
        get_device_name=lambda i: "Tesla V100",
        get_device_capability=lambda i: (7, 0),
        is_bf16_supported=lambda: True,  # old torch: counts emulation
    )
    facts = gpu_facts(SimpleNamespace(cuda=cuda, version=SimpleNamespace(hip=None)))
    assert resolve("auto", facts).dtype == "float16"


CPU_BF16 = DeviceFacts("cpu", True, False, "Xeon: AMX")
CPU_PLAIN = DeviceFacts("cpu", False, False, "EPYC: no AMX, no AVX512-BF16")
GPU_NO_BF16 = DeviceFacts("cuda", False, True, "Tesla T4 (compute 7.5)")


@pytest.mark.parametrize("facts", [CPU_BF16, CPU_PLAIN, GPU_NO_BF16])
def test_explicit_float32_is_honoured_everywhere_without_a_warning(facts: DeviceFacts) -> None:
    r = resolve("float32", facts)
    assert (r.dtype, r.warning) == ("float32", None) and r.reason.startswith("configured")


@pytest.mark.parametrize(
    ("requested", "facts", "slow"),
    [
        ("float16", CPU_BF16, "float16 on a CPU"),
        ("float16", CPU_PLAIN, "float16 on a CPU"),
        ("bfloat16", CPU_PLAIN, "emulated"),
        ("bfloat16", GPU_NO_BF16, "emulated"),
    ],
)
def test_slow_explicit_choices_are_honoured_and_warned_about(
    requested: str, facts: DeviceFacts, slow: str
) -> None:
    r = resolve(requested, facts)
    assert r.dtype == requested  # never silently changed
    assert r.warning is not None and slow in r.warning and "auto would serve" in r.warning


def test_fast_explicit_choices_carry_no_warning() -> None:
    assert resolve("bfloat16", CPU_BF16).warning is None
    assert resolve("float16", GPU_NO_BF16).warning is None


def test_an_unknown_dtype_is_refused_naming_what_is_accepted() -> None:
    with pytest.raises(ArtifactError, match=r"'int8'.*auto, float32, bfloat16, float16"):
        resolve("int8", CPU_BF16)


def test_this_hosts_facts_come_from_the_real_torch() -> None:
    """Whatever this host is, the real probes answer and auto resolves to a served dtype."""
    facts = precision.facts_for("cpu")
    assert facts.platform == "cpu"
    assert resolve("auto", facts).dtype == ("bfloat16" if facts.bf16_native else "float32")
