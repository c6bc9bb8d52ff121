"""GPU inventory from ``rocm-smi`` and ``nvidia-smi``.

Parsers are pure functions of the tool's text (tested on real captures in
shared/fixtures/gpu/); :func:`query_gpus` runs the tool. rocm-smi's JSON key names changed
across ROCm 4.x-7.x (``Card series`` -> ``Card Series``, ``GPU ID`` -> ``Device ID`` ...), its
values are always strings, and it prints warnings (stderr) next to the JSON, so the JSON parser
looks for the object instead of trusting the first byte.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from vllm_sr.errors import PlacementError

ROCM_SMI_ARGS = [
    "--showproductname",
    "--showmeminfo",
    "vram",
    "--showuse",
    "--showuniqueid",
    "--showbus",
    "--json",
]
NVIDIA_FIELDS = [
    "index",
    "name",
    "uuid",
    "pci.bus_id",
    "memory.total",
    "memory.used",
    "memory.free",
    "utilization.gpu",
]
NVIDIA_SMI_ARGS = [f"--query-gpu={','.join(NVIDIA_FIELDS)}", "--format=csv,noheader,nounits"]
TOOLS = {"rocm": "rocm-smi", "cuda": "nvidia-smi"}
MIB = 1024 * 1024
_NA = re.compile(
    r"^\[?(N/A|Not Supported|Requested functionality has been deprecated|"
    r"Function Not Found|Unknown Error|Insufficient Permissions)\]?$",
    re.I,
)
_HEX = re.compile(r"^0x[0-9a-fA-F]+$")


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as the vendor tool reports it. ``index`` is the tool's device index (the value
    for HIP_/CUDA_VISIBLE_DEVICES); sizes are bytes; None = the tool did not say."""

    platform: str
    index: int
    name: str
    vram_total: int | None = None
    vram_used: int | None = None
    vram_free_reported: int | None = None
    use_percent: float | None = None
    unique_id: str | None = None
    pci_bus: str | None = None

    @property
    def vram_free(self) -> int | None:
        if self.vram_free_reported is not None:
            return self.vram_free_reported
        if self.vram_total is not None and self.vram_used is not None:
            return max(0, self.vram_total - self.vram_used)
        return None

    def describe(self) -> str:
        mem = ""
        if self.vram_free is not None and self.vram_total is not None:
            mem = f", {self.vram_free // MIB} MiB free of {self.vram_total // MIB} MiB"
        return f"{self.platform}:{self.index} {self.name}{mem}"


def _value(raw: Any) -> str | None:
    if raw is None:
        return None
    text = str(raw).strip()
    if not text or _NA.match(text):
        return None
    return text


def _int(raw: Any, scale: int = 1) -> int | None:
    text = _value(raw)
    if text is None:
        return None
    text = re.sub(r"\s*(MiB|B|%|W)$", "", text)
    try:
        return int(float(text) * scale)
    except ValueError:
        return None


def _float(raw: Any) -> float | None:
    text = _value(raw)
    if text is None:
        return None
    try:
        return float(text.rstrip("%").strip())
    except ValueError:
        return None


def _first(card: Mapping[str, Any], *keys: str, reject_hex: bool = False) -> str | None:
    for key in keys:
        val = _value(card.get(key))
        if val is not None and not (reject_hex and _HEX.match(val)):
            return val
    return None


def _rocm_card(index: int, card: Mapping[str, Any]) -> GpuInfo:
    # Name resolution fails on some hosts (ROCm 4.3 prints the vendor id 0x1002 as the
    # series), so hex values are skipped and the PCI device id is the last resort.
    name = _first(card, "Card Series", "Card series", "Device Name", reject_hex=True)
    name = name or _first(card, "Card Model", "Card model", reject_hex=True)
    if name is None:
        dev_id = _first(card, "Device ID", "GPU ID")
        name = f"AMD GPU {dev_id}" if dev_id else "AMD GPU"
    return GpuInfo(
        platform="rocm",
        index=index,
        name=name,
        vram_total=_int(card.get("VRAM Total Memory (B)")),
        vram_used=_int(card.get("VRAM Total Used Memory (B)")),
        use_percent=_float(card.get("GPU use (%)")),
        unique_id=_first(card, "Unique ID"),
        pci_bus=_first(card, "PCI Bus"),
    )


def _card_index(key: str) -> int | None:
    m = re.fullmatch(r"card(\d+)", key)
    return int(m.group(1)) if m else None


def _rocm_text_problem(text: str) -> PlacementError | None:
    if "Driver not initialized" in text or "amdgpu not found" in text:
        return PlacementError(
            "rocm-smi: the amdgpu driver is not loaded (" + _last_line(text) + "); load it, "
            "or use --platform cpu"
        )
    return None


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "(no output)"


def _rocm_no_json(text: str) -> str:
    warnings = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("WARNING")]
    seen = warnings[0] if warnings else _last_line(text)
    kind = "its text table, not JSON" if "ROCm S" in text else "no JSON"
    return (
        f"rocm-smi printed {kind} ({seen}); accepted: the output of "
        f"`rocm-smi {' '.join(ROCM_SMI_ARGS)}`"
    )


def parse_rocm_smi_json(text: str) -> list[GpuInfo]:
    """``rocm-smi ... --json`` stdout (warnings around it tolerated) -> GPUs sorted by index.
    The no-GPU output ``{"system": {...}}`` gives an empty list."""
    problem = _rocm_text_problem(text)
    found = re.search(r"^\s*[\[{]", text, re.M)
    if found is None:
        raise problem or PlacementError(_rocm_no_json(text))
    start = found.end() - 1
    try:
        data, _ = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError as exc:
        raise PlacementError(
            f"rocm-smi printed garbled JSON ({exc.msg} at char {exc.pos})"
        ) from exc
    if not isinstance(data, dict):
        raise PlacementError(
            f"rocm-smi printed JSON of an unexpected shape (a {type(data).__name__}, not an "
            "object of cardN entries)"
        )
    gpus = []
    for key, card in data.items():
        idx = _card_index(str(key))
        if idx is not None and isinstance(card, dict):
            gpus.append(_rocm_card(idx, card))
    return sorted(gpus, key=lambda g: g.index)


def parse_rocm_smi_csv(text: str) -> list[GpuInfo]:
    """``rocm-smi ... --csv`` (header ``device,...``; rows card0.. and cardsystem)."""
    rows = list(csv.DictReader(io.StringIO(text.strip())))
    gpus = []
    for row in rows:
        idx = _card_index(row.get("device") or "")
        if idx is not None:
            gpus.append(_rocm_card(idx, row))
    return sorted(gpus, key=lambda g: g.index)


def _nvidia_header(cells: list[str]) -> list[str] | None:
    names = [re.sub(r"\s*\[.*\]$", "", c.strip()) for c in cells]
    if "name" in names or "index" in names or "memory.total" in names:
        return names
    return None


def _raise_nvidia_driver_problem(text: str) -> None:
    if "NVIDIA-SMI has failed" in text or "couldn't communicate with the NVIDIA driver" in text:
        raise PlacementError(
            f"nvidia-smi: the NVIDIA driver is not reachable ({_last_line(text)[:100]}); load "
            "it, or use --platform cpu"
        )


def parse_nvidia_csv(text: str, fields: list[str] | None = None) -> list[GpuInfo]:
    """``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]``. With a header the
    columns are found by name (units stripped); without one they are ``fields`` (default: the
    query vllm-sr runs)."""
    _raise_nvidia_driver_problem(text)
    rows = [r for r in csv.reader(io.StringIO(text.strip()), skipinitialspace=True) if r]
    if not rows:
        return []
    header = _nvidia_header(rows[0])
    if header is not None:
        rows = rows[1:]
    cols = header or fields or NVIDIA_FIELDS
    gpus = []
    for n, row in enumerate(rows):
        if len(row) != len(cols):
            raise PlacementError(
                f"nvidia-smi printed garbled CSV: line {n + 1} has {len(row)} fields, expected "
                f"{len(cols)} ({', '.join(cols[:8])}{'...' if len(cols) > 8 else ''}): "
                f"{','.join(row)[:120]!r}"
            )
        cell = dict(zip(cols, row, strict=True))
        index = _int(cell.get("index"))
        gpus.append(
            GpuInfo(
                platform="cuda",
                index=n if index is None else index,
                name=_value(cell.get("name")) or "NVIDIA GPU",
                vram_total=_int(cell.get("memory.total"), MIB),
                vram_used=_int(cell.get("memory.used"), MIB),
                vram_free_reported=_int(cell.get("memory.free"), MIB),
                use_percent=_float((cell.get("utilization.gpu") or "").replace("%", "")),
                unique_id=_value(cell.get("uuid")),
                pci_bus=_value(cell.get("pci.bus_id")),
            )
        )
    return sorted(gpus, key=lambda g: g.index)


def parse_nvidia_xml(text: str) -> list[GpuInfo]:
    """``nvidia-smi -q -x``: GPUs in document order (that order is the index)."""
    try:
        root = ET.fromstring(text.strip())
    except ET.ParseError as exc:
        raise PlacementError(f"nvidia-smi printed garbled XML ({exc})") from exc
    gpus = []
    for n, gpu in enumerate(root.findall("gpu")):
        minor = _int(gpu.findtext("minor_number"))
        gpus.append(
            GpuInfo(
                platform="cuda",
                index=n,
                name=_value(gpu.findtext("product_name")) or "NVIDIA GPU",
                vram_total=_int(gpu.findtext("fb_memory_usage/total"), MIB),
                vram_used=_int(gpu.findtext("fb_memory_usage/used"), MIB),
                vram_free_reported=_int(gpu.findtext("fb_memory_usage/free"), MIB),
                use_percent=_float(gpu.findtext("utilization/gpu_util")),
                unique_id=_value(gpu.findtext("uuid")),
                pci_bus=_value(gpu.get("id")) or (str(minor) if minor is not None else None),
            )
        )
    return gpus


def parse_tool_output(platform: str, text: str) -> list[GpuInfo]:
    """Pick the parser by the output's shape (JSON, CSV, XML) for the platform's tool."""
    stripped = text.lstrip()
    if platform == "rocm":
        if stripped.startswith("device,"):
            return parse_rocm_smi_csv(stripped)
        return parse_rocm_smi_json(text)
    if platform == "cuda":
        _raise_nvidia_driver_problem(stripped)
        if stripped.startswith("<?xml") or stripped.startswith("<nvidia_smi_log"):
            return parse_nvidia_xml(stripped)
        head = stripped[:400]
        if (
            stripped.startswith(("+--", "GPU ", "="))
            or "NVSMI LOG" in head
            or "NVIDIA-SMI " in head
        ):
            first = stripped.splitlines()[0].strip()[:80]
            raise PlacementError(
                f"nvidia-smi printed a report, not CSV ({first}); accepted: "
                f"the output of `nvidia-smi {' '.join(NVIDIA_SMI_ARGS)}`"
            )
        return parse_nvidia_csv(text)
    raise PlacementError(f"platform {platform!r} has no GPU inventory; accepted: rocm, cuda")


Runner = Callable[..., "subprocess.CompletedProcess[str]"]


def query_gpus(
    platform: str,
    *,
    env: Mapping[str, str] | None = None,
    runner: Runner = subprocess.run,
    timeout_s: float = 20.0,
) -> list[GpuInfo]:
    """Run the platform's tool and parse it. Missing tool, non-zero exit, garbled output and
    zero GPUs each raise a PlacementError that says what was seen."""
    env = dict(os.environ if env is None else env)
    tool = TOOLS.get(platform)
    if tool is None:
        raise PlacementError(f"platform {platform!r} has no GPU inventory; accepted: rocm, cuda")
    path = shutil.which(tool, path=env.get("PATH", os.defpath))
    if path is None:
        raise PlacementError(
            f"--platform {platform}: {tool} not found on PATH; install it (it comes with the "
            f"{'ROCm' if platform == 'rocm' else 'NVIDIA'} driver tools) or use --platform cpu"
        )
    args = ROCM_SMI_ARGS if platform == "rocm" else NVIDIA_SMI_ARGS
    try:
        proc = runner([path, *args], capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired as exc:
        raise PlacementError(f"{tool} did not answer within {timeout_s:g} s") from exc
    except OSError as exc:
        raise PlacementError(f"{tool} could not run: {exc.strerror}") from exc
    out, err = proc.stdout or "", proc.stderr or ""
    if proc.returncode != 0:
        known = _rocm_text_problem(out + err) if platform == "rocm" else None
        if known is not None:
            raise known
        if platform == "cuda":
            _raise_nvidia_driver_problem(out + err)
        raise PlacementError(
            f"{tool} exited with status {proc.returncode}: {_last_line(err or out)}"
        )
    gpus = parse_tool_output(platform, out if out.strip() else err)
    if not gpus:
        raise PlacementError(f"{tool} found no GPUs ({_last_line(err or out)}); use --platform cpu")
    return gpus


def usage_of(gpu: GpuInfo) -> dict[str, int | float | None]:
    """One GPU's usage as the supervisor shows it (None = the tool did not say)."""
    return {
        "memory_used_bytes": gpu.vram_used,
        "memory_total_bytes": gpu.vram_total,
        "utilization_percent": gpu.use_percent,
    }


def gpu_usage(
    platform: str,
    *,
    env: Mapping[str, str] | None = None,
    runner: Runner = subprocess.run,
    timeout_s: float = 5.0,
) -> dict[int, dict[str, int | float | None]]:
    """``{host_id: {"memory_used_bytes", "memory_total_bytes", "utilization_percent"}}`` for
    every GPU the platform's tool lists, keyed by the tool's index (the host ID placement
    reports as ``ReplicaSpec.host_device``). Same tool and query as the inventory, with a short
    timeout: meant to be called from a thread every few seconds. Raises PlacementError like
    :func:`query_gpus` when the tool is missing or fails."""
    gpus = query_gpus(platform, env=env, runner=runner, timeout_s=timeout_s)
    return {g.index: usage_of(g) for g in gpus}
