"""`vllm-sr worker ARTIFACT (--uds PATH | --port N) ...`: one model worker process (the
supervisor starts these; documented in docs/worker.md)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def _int_at_least(minimum: int, what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} must be {what}")
        return value

    return parse


_nonnegative = _int_at_least(0, "0 (off) or a positive number of bytes")
_positive = _int_at_least(1, "at least 1")


def _port(text: str) -> int:
    value = _positive(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1-65535)")
    return value


def _device(text: str) -> str:
    kind, sep, index = text.partition(":")
    if text == "cpu" or (kind in ("cuda", "rocm") and sep and index.isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"{text!r} is not accepted; use cpu, cuda:N or rocm:N")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "worker",
        help="run one model worker (internal: the supervisor starts these)",
        description="Serve one artifact on one device over HTTP (Unix socket or TCP).",
    )
    p.add_argument("artifact", metavar="ARTIFACT", help="vllm-sr/d3-edge or a local HF model dir")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--uds", metavar="PATH", help="listen on this Unix socket")
    where.add_argument("--port", type=_port, metavar="N", help="listen on this TCP port")
    p.add_argument("--host", default="127.0.0.1", help="TCP address with --port")
    p.add_argument("--device", type=_device, default="cpu", help="cpu, cuda:N or rocm:N")
    p.add_argument(
        "--threads", type=_positive, help="intra-op CPU threads (default: half the CPUs)"
    )
    p.add_argument("--max-num-seqs", type=_positive, help="rows per forward (default: calibrated)")
    p.add_argument(
        "--max-num-batched-tokens",
        type=_positive,
        help="padded tokens per forward (default: calibrated)",
    )
    p.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16", "float16"),
        default="auto",
        help="precision of the forward (default auto: bfloat16 where the device has it "
        "natively, float16 on other GPUs, else float32)",
    )
    p.add_argument(
        "--max-input-tokens",
        type=_positive,
        metavar="N",
        help="most tokens of one input (default: the model's maximum; capped at it)",
    )
    p.add_argument(
        "--overflow",
        choices=("reject", "truncate"),
        default="reject",
        help="an over-long input: reject (400 max_length_exceeded, unless the request sends "
        '"truncate": true; default) or truncate to the limit',
    )
    p.add_argument("--replica-id", metavar="ID", help="replica id, used as the log prefix")
    p.add_argument(
        "--result-cache-bytes",
        type=_nonnegative,
        default=0,
        metavar="N",
        help="result cache bound in bytes (default 0: no cache)",
    )
    p.add_argument(
        "--revision", metavar="REV", help="the artifact revision the deployment asks for"
    )
    p.add_argument(
        "--served-model-name",
        action="append",
        default=[],
        metavar="NAME",
        help="another name requests may use in 'model' (repeatable)",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from vllm_sr.logs import setup_logging
    from vllm_sr.worker.main import WorkerOptions, run

    setup_logging("worker", args.replica_id)
    opts = WorkerOptions(
        artifact=args.artifact,
        uds=args.uds,
        port=args.port,
        host=args.host,
        device=args.device,
        threads=args.threads,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        replica_id=args.replica_id,
        served_names=tuple(args.served_model_name),
        result_cache_bytes=args.result_cache_bytes,
        revision=args.revision,
        dtype=args.dtype,
        max_input_tokens=args.max_input_tokens,
        overflow=args.overflow,
    )
    return run(opts)
