"""The deployment flags shared by ``vllm-sr config apply`` and ``vllm-sr serve``.

Both commands take exactly these and write the same canonical ``replicas`` with them (there is
no separate data-parallel state): ``serve`` adds its host-setting flags on top.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from vllm_sr.config.files import DEFAULT_CONFIG_PATH
from vllm_sr.errors import UsageError

PLATFORMS = ("cpu", "rocm", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")


def _positive(flag: str):  # type: ignore[no-untyped-def]
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{flag} {text!r}: not an integer; accepted: a positive integer"
            ) from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{flag} {value}: accepted: a positive integer (>= 1)")
        return value

    return parse


@dataclass(frozen=True)
class DeploymentFlags:
    """Parsed deployment flags; None = the flag was not given (keep the configured value)."""

    model: str | None = None
    engine: bool = False
    platform: str | None = None
    data_parallel_size: int | None = None
    device_ids: tuple[int, ...] | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    dtype: str | None = None
    threads: int | None = None
    config_path: Path = DEFAULT_CONFIG_PATH
    dry_run: bool = False
    json: bool = False


def add_deployment_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        nargs="?",
        metavar="MODEL",
        help="artifact of the default (decision model's) deployment, e.g. vllm-sr/d3-edge; "
        "alone it keeps the configured replicas and engine arguments",
    )
    parser.add_argument(
        "-e",
        "--engine",
        action="store_true",
        help="Engine mode: write router.enabled: false (routing consumers off)",
    )
    parser.add_argument(
        "--platform",
        choices=PLATFORMS,
        help="where the default deployment's workers run (default: keep the configured one; "
        "cpu for a new file)",
    )
    parser.add_argument(
        "-dp",
        "--data-parallel-size",
        type=_positive("-dp"),
        metavar="N",
        help="independent workers of the default deployment (each its own copy of the weights)",
    )
    parser.add_argument(
        "--device-ids",
        metavar="LIST",
        help="GPU IDs, e.g. 0,1: host GPU indices, or allocation ordinals when the process was "
        "given GPUs (ROCR_/HIP_/CUDA_/NVIDIA_VISIBLE_DEVICES set, or inside a Kubernetes pod); "
        "fewer IDs than -dp repeat in order (several workers on one GPU)",
    )
    parser.add_argument(
        "--max-num-seqs",
        type=_positive("--max-num-seqs"),
        metavar="N",
        help="engine_args.max_num_seqs for every replica",
    )
    parser.add_argument(
        "--max-num-batched-tokens",
        type=_positive("--max-num-batched-tokens"),
        metavar="N",
        help="engine_args.max_num_batched_tokens for every replica",
    )
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        help="engine_args.dtype for every replica: auto (bfloat16 where the device has it "
        "natively, float16 on other GPUs, else float32), float32, bfloat16 or float16",
    )
    parser.add_argument(
        "--threads",
        type=_positive("--threads"),
        metavar="N",
        help="threads of each CPU worker of the default deployment (writes its threads; e.g. "
        "the count the adaptive learner reports); capped at the CPU budget, wins over "
        "VLLM_SRUN_CPU_THREADS; refused on GPU platforms",
    )
    _add_file_flags(parser)


def _add_file_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        default=DEFAULT_CONFIG_PATH,
        metavar="PATH",
        help=f"the canonical resource (default {DEFAULT_CONFIG_PATH})",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan and the change it would write; change nothing",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def parse_device_ids(text: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",")]
    if not parts or any(not p.isdigit() for p in parts):
        raise UsageError(
            f"--device-ids {text!r}: accepted: comma-separated GPU indices or ordinals such as 0,1 "
            "(repeat an index to place several workers on one GPU)"
        )
    return tuple(int(p) for p in parts)


def flags_from_args(args: argparse.Namespace) -> DeploymentFlags:
    device_ids = None
    if getattr(args, "device_ids", None) is not None:
        device_ids = parse_device_ids(args.device_ids)
    return DeploymentFlags(
        model=getattr(args, "model", None),
        engine=bool(getattr(args, "engine", False)),
        platform=getattr(args, "platform", None),
        data_parallel_size=getattr(args, "data_parallel_size", None),
        device_ids=device_ids,
        max_num_seqs=getattr(args, "max_num_seqs", None),
        max_num_batched_tokens=getattr(args, "max_num_batched_tokens", None),
        dtype=getattr(args, "dtype", None),
        threads=getattr(args, "threads", None),
        config_path=Path(getattr(args, "config", DEFAULT_CONFIG_PATH)),
        dry_run=bool(getattr(args, "dry_run", False)),
        json=bool(getattr(args, "json", False)),
    )
