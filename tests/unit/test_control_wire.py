"""The control socket on the one server (issue 27): every error it sends is the one error answer
of ``vllm_sr.wire`` (the same document, ``Allow`` on a 405, ``Retry-After`` on a 503), the
peer it judges is the kernel's account of the connecting process, and ``{id}`` segments reach
the backend decoded. Real Unix socket, raw bytes."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.control_fake import FakeBackend
from tests.support.workers import short_socket_dir
from vllm_sr import errors, wire
from vllm_sr.control.server import ControlServer


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    d = short_socket_dir(prefix="vsr-cw-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend({"primary": ["cpu", "cpu"]})


@pytest.fixture
async def server(backend: FakeBackend, sock_dir: Path) -> AsyncIterator[ControlServer]:
    async with ControlServer(backend, sock_dir / "c.sock", group=None, heartbeat_s=30) as srv:
        yield srv


async def exchange(path: Path, method: str, target: str, body: bytes = b"") -> Any:
    """One request on its own connection: (status, lower-case headers, parsed body)."""
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(
        f"{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
    return int(lines[0].split()[1]), headers, json.loads(payload)


async def test_a_refused_config_is_the_wire_document_with_its_problems(
    server: ControlServer, backend: FakeBackend
) -> None:
    refusal = errors.ConfigError(
        "config.yaml: 2 problems",
        ["config.yaml:3: global.x: unknown key 'x'", "config.yaml:9: replicas: not a number"],
    )
    backend.refuse = refusal
    status, headers, body = await exchange(server.path, "POST", "/v1/reload")
    assert status == 400 and headers["content-type"] == wire.JSON_TYPE
    assert body == wire.error_document(refusal)
    assert body["error"]["details"]["problems"] == refusal.problems


async def test_a_503_carries_retry_after_by_the_one_rule(
    server: ControlServer, backend: FakeBackend
) -> None:
    backend.refuse = errors.Unavailable("the supervisor is busy", retry_after_s=2.2)
    status, headers, body = await exchange(server.path, "POST", "/v1/replicas/primary-0/drain")
    assert status == 503 and headers["retry-after"] == "3"  # rounded up
    assert body["error"] == {
        "code": "unavailable",
        "message": "the supervisor is busy",
        "retryable": True,
        "details": {"retry_after_s": 2.2},
    }


async def test_unknown_paths_and_methods_are_the_one_answer(server: ControlServer) -> None:
    status, _, body = await exchange(server.path, "GET", "/v1/replicas/primary-0/nothing")
    assert (status, body["error"]["code"], body["error"]["retryable"]) == (404, "not_found", False)
    status, headers, body = await exchange(server.path, "GET", "/v1/replicas/primary-0/eject")
    assert status == 405 and headers["allow"] == "POST"
    assert body["error"]["code"] == "method_not_allowed"
    assert body["error"]["details"] == {"allowed": ["POST"]}


async def test_the_caller_is_the_kernel_s_account_of_the_peer(server: ControlServer) -> None:
    status, _, body = await exchange(server.path, "GET", "/v1/health")
    assert status == 200
    assert body["caller"] == {"uid": os.geteuid(), "may_mutate": True, "why": None}


async def test_a_percent_encoded_replica_id_reaches_the_backend_decoded(
    server: ControlServer, backend: FakeBackend
) -> None:
    status, _, body = await exchange(server.path, "POST", "/v1/replicas/primary%2D0/drain")
    assert status == 200 and body["ok"] is True
    assert [(c.kind, c.replica) for c in backend.commands] == [("drain", "primary-0")]
