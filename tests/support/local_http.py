"""A client for an in-process server on a real TCP socket: aiohttp's ClientSession with the
calls the tests make (``get``, ``post``, ``close``, ``host``, ``port``)."""

from __future__ import annotations

from typing import Any

import aiohttp


class LocalClient:
    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.session = aiohttp.ClientSession(base_url=f"http://{host}:{port}")

    def get(self, path: str, **kw: Any) -> Any:
        return self.session.get(path, **kw)

    def post(self, path: str, **kw: Any) -> Any:
        return self.session.post(path, **kw)

    def request(self, method: str, path: str, **kw: Any) -> Any:
        return self.session.request(method, path, **kw)

    async def close(self) -> None:
        await self.session.close()
