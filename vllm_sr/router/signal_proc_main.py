"""One signal process: ``python -m vllm_sr.router.signal_proc_main --fd N --name ID
[--preload-language]``, started by the supervisor (``vllm_sr/supervisor/signal_procs.py``) with
its end of a socket pair as file descriptor N.

It loads presidio's recognizers and lingua's detector (every language's models with
``--preload-language``, which serve passes when the plan has a language rule; else they load
per script on first use, in this process, off the frontend's loop), says ``ready``, then
answers jobs one at a time with :func:`vllm_sr.router.cpu_signals.cpu_report`, the function the
loop runs itself, so results are identical: a job's CPU-bound families, and the reading of the
deployment answers it carries with the deployments' questions it was sent before. It exits
when its socket closes (the service is gone) or on SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socket
import sys
from collections import OrderedDict
from typing import TypeVar

from vllm_sr import heap
from vllm_sr.router.cpu_signals import CpuSignals, CpuSignalSpec, ViewFields, cpu_report
from vllm_sr.router.deployment_questions import DeploymentQuestions
from vllm_sr.router.derived_signals import DerivedSignals
from vllm_sr.router.signal_proc_wire import HEADER, MAX_FRAME_BYTES, encode

log = logging.getLogger("vllm_sr.signals")
KEEP_SPECS = 8  # generations kept (a reload's chats in flight still name the old one)
T = TypeVar("T")
KEEP_QUESTIONS = 32  # deployments' questions kept (a generation's, its eval plan's, the old)


def read_exact(sock: socket.socket, size: int) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < size:
        got = sock.recv(min(size - len(chunks), 1 << 20))
        if not got:
            return None
        chunks += got
    return bytes(chunks)


def read_message(sock: socket.socket) -> tuple[object, ...] | None:
    import pickle

    head = read_exact(sock, HEADER.size)
    if head is None:
        return None
    (size,) = HEADER.unpack(head)
    if size > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {size} bytes over the cap")
    body = read_exact(sock, size)
    if body is None:
        return None
    message = pickle.loads(body)
    assert isinstance(message, tuple)
    return message


def load(preload_language: bool) -> None:
    from vllm_sr.router.language import detect_language, language_detector
    from vllm_sr.router.signals_pii import detector

    detector().load()
    language_detector(preload=preload_language)
    if preload_language:
        detect_language("warm up the language detector", 0.0)


def keep(store: OrderedDict[int, T], key: int, value: T, most: int) -> None:
    """``value`` under ``key``, the oldest entries dropped past ``most``."""
    store[key] = value
    while len(store) > most:
        store.popitem(last=False)


def serve(sock: socket.socket) -> None:
    import pickle

    specs: OrderedDict[int, tuple[CpuSignals, DerivedSignals | None]] = OrderedDict()
    questions: OrderedDict[int, DeploymentQuestions] = OrderedDict()
    while True:
        message = read_message(sock)
        if message is None:
            return
        kind = message[0]
        if kind == "config":
            spec = pickle.loads(message[2])  # type: ignore[arg-type]
            assert isinstance(spec, CpuSignalSpec)
            built = (CpuSignals.from_spec(spec), spec.derived)
            keep(specs, int(message[1]), built, KEEP_SPECS)  # type: ignore[call-overload]
            continue
        if kind == "questions":
            held = pickle.loads(message[2])  # type: ignore[arg-type]
            assert isinstance(held, DeploymentQuestions)
            keep(questions, int(message[1]), held, KEEP_QUESTIONS)  # type: ignore[call-overload]
            continue
        _, job_id, spec_id, fields, answers, known = message
        got = specs.get(spec_id)  # type: ignore[call-overload]
        if got is None or not isinstance(fields, ViewFields):
            sock.sendall(encode(("error", job_id, f"unknown generation {spec_id}")))
            continue
        try:
            held_all = [(questions[q_id], body) for q_id, body in answers]  # type: ignore[attr-defined]
        except KeyError:
            sock.sendall(encode(("error", job_id, "unknown deployment questions")))
            continue
        signals, derived = got
        finish = (known, derived) if isinstance(known, dict) and derived is not None else None
        try:
            report = cpu_report(signals, fields.view(), held_all, finish)
        except Exception as exc:  # a bug in a family: that job fails, the process lives
            log.exception("signal job failed")
            sock.sendall(encode(("error", job_id, f"{type(exc).__name__}: {exc}")))
            continue
        sock.sendall(encode(("ok", job_id, report)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vllm-sr signal process")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--name", default="signals")
    parser.add_argument("--preload-language", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    sock = socket.socket(fileno=args.fd)
    # The service gone (its end closed) while loading or serving: nothing to answer, exit 0.
    with contextlib.suppress(BrokenPipeError, ConnectionResetError, KeyboardInterrupt):
        load(args.preload_language)
        heap.settle()  # the models loaded: frozen, and young collections rarer (as a frontend)
        sock.sendall(encode(("ready", os.getpid())))
        serve(sock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
