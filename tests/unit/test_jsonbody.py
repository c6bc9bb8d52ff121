"""The one JSON body reader (vllm_sr.jsonbody): typed errors naming what was wrong, the model's
refusals by field, and the size cap and read timeout on a real server socket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from vllm_sr import jsonbody
from vllm_sr.errors import InvalidRequest, VllmSrError


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")
    replicas: StrictInt = Field(ge=0)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\xff{}", "body: not UTF-8 (bad byte at offset 0)"),
        (b"{nope", "body: not valid JSON"),
        (b"[1]", "body: expected a JSON object, got array"),
        (b'"x"', "body: expected a JSON object, got string"),
        (b"", "body: not valid JSON"),
        (b'{"replicas": "2"}', "replicas: Input should be a valid integer (got '2')"),
        (b'{"replicas": 1, "x": 0}', "x: unknown field"),
    ],
)
def test_parse_refusals_name_what_was_wrong(raw: bytes, message: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        jsonbody.parse_json(raw, Body)
    assert info.value.message.startswith(message)


def test_parse_returns_the_dict_or_the_model() -> None:
    assert jsonbody.parse_json(b'{"a": [1]}') == {"a": [1]}
    assert jsonbody.parse_json(b" ", allow_empty=True) == {}
    assert jsonbody.parse_json(b'{"replicas": 3}', Body).replicas == 3


@pytest.fixture
async def url() -> AsyncIterator[str]:
    async def echo(request: web.Request) -> web.Response:
        try:
            body = await jsonbody.read_json(request, max_bytes=64, timeout_s=0.3)
        except VllmSrError as exc:
            return web.json_response(exc.to_json(), status=exc.http_status)
        return web.json_response(body)

    app = web.Application(client_max_size=1 << 20)  # larger than the reader's own cap
    app.router.add_post("/", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}/"
    await runner.cleanup()


async def _post(url: str, data: Any) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as s, s.post(url, data=data) as resp:
        return resp.status, await resp.json()


async def test_read_caps_size_even_when_chunked_and_times_out(url: str) -> None:
    assert await _post(url, b'{"a": 1}') == (200, {"a": 1})
    status, body = await _post(url, b'{"a": "' + b"x" * 100 + b'"}')
    assert status == 413 and "over the cap of 64 bytes" in body["error"]["message"]

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: only the read can tell
        for _ in range(10):
            yield b" " * 20

    status, body = await _post(url, chunks())
    assert status == 413 and body["error"]["code"] == "request_too_large"

    async def stalls() -> AsyncIterator[bytes]:
        yield b'{"a"'
        await asyncio.sleep(2)

    status, body = await _post(url, stalls())
    assert status == 408 and "not received within 0.3 s" in body["error"]["message"]
