"""The one outbound client to LLM backends (vllm_sr/router/backend_client.py) on real sockets
against real stand-in backends: TLS verified against the CA the system store names, redirects
passed back rather than followed, the connection cap, a stream passed through chunk by chunk,
and every failure before the first byte typed with its reason (what the backend fallback acts
on), a failure after it never."""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.backends import StandInBackend
from tests.support.workers import free_tcp_port
from vllm_sr.config.routing_providers import Providers
from vllm_sr.errors import DeadlineExceeded
from vllm_sr.httpserver import HttpServer, Request, Response, StreamResponse
from vllm_sr.pool.client import Broken
from vllm_sr.router.backend_proxy import AttemptFailed, BackendUnavailable, Exchange
from vllm_sr.router.backends import BackendSet

CHAT = {"model": "m", "messages": [{"role": "user", "content": "say something long now"}]}


def one_model(*refs: dict[str, Any]) -> Providers:
    return Providers.model_validate(
        {"defaults": {"default_model": "m"}, "models": [{"name": "m", "backend_refs": list(refs)}]}
    )


def chat_request() -> Request:
    return Request("POST", "/v1/chat/completions", "", {}, b"")


async def until(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not cond():
        assert loop.time() < end, "condition not met in time"
        await asyncio.sleep(0.01)


@pytest.fixture
async def standin() -> AsyncIterator[StandInBackend]:
    b = await StandInBackend("a").start()
    try:
        yield b
    finally:
        if b.hold is not None:
            b.hold.set()
        await b.stop()


@pytest.fixture
async def started() -> AsyncIterator[Callable[..., Any]]:
    sets: list[BackendSet] = []

    async def make(providers: Providers, **kw: Any) -> BackendSet:
        s = BackendSet(providers, **kw)
        await s.start(health_checks=False)
        sets.append(s)
        return s

    yield make
    for s in sets:
        await s.close()


# -- TLS -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not installed")
    d = tmp_path_factory.mktemp("tls")
    key, crt = d / "key.pem", d / "cert.pem"
    args = ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
    args += ["-nodes", "-keyout", str(key), "-out", str(crt), "-days", "1"]
    args += ["-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"]
    subprocess.run(
        ["openssl", *args],
        check=True,
        capture_output=True,
    )
    return crt, key


@pytest.fixture
async def tls_standin(cert: tuple[Path, Path]) -> AsyncIterator[StandInBackend]:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert[0], cert[1])
    b = await StandInBackend("secure").start(ssl_context=ctx)
    try:
        yield b
    finally:
        await b.stop()


async def test_an_https_backend_is_verified_against_the_system_store_it_is_given(
    tls_standin: StandInBackend,
    cert: tuple[Path, Path],
    started: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    provs = one_model({"base_url": f"https://localhost:{tls_standin.port}/v1"})
    monkeypatch.setenv("SSL_CERT_FILE", str(cert[0]))  # OpenSSL's way to name the CA store
    trusting = await started(provs)
    backend = trusting.pick("m")
    await trusting.check(backend)
    assert backend.health.state == "healthy"
    out = await trusting.proxy(backend, Exchange(CHAT, chat_request(), {}))
    assert isinstance(out, Response) and out.status == 200
    assert json.loads(out.body)["choices"][0]["message"]["content"].startswith("secure got:")

    monkeypatch.delenv("SSL_CERT_FILE")  # the system's own store does not know this CA
    strict = await started(provs)
    backend = strict.pick("m")
    with pytest.raises(BackendUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
        await strict.proxy(backend, Exchange(CHAT, chat_request(), {}))
    assert backend.health.state == "unhealthy"
    assert len(tls_standin.received) == 1  # the refused one never got its chat


# -- redirects -----------------------------------------------------------------------------------


async def test_a_redirect_is_the_backends_answer_not_followed(
    standin: StandInBackend, started: Callable[..., Any]
) -> None:
    other = await StandInBackend("other").start()
    try:
        standin.fault = "redirect"
        standin.redirect_to = f"http://{other.endpoint}/v1/chat/completions"
        s = await started(one_model({"endpoint": standin.endpoint}))
        out = await s.proxy(s.pick("m"), Exchange(CHAT, chat_request(), {}, early_failure=True))
        assert isinstance(out, Response) and out.status == 302
        assert "Location" not in out.headers  # it names the backend's side, not ours
        assert not other.received  # the chat was not sent on, nor turned into a GET
        assert len(standin.received) == 1
    finally:
        await other.stop()


# -- the connection cap --------------------------------------------------------------------------


async def test_chats_beyond_the_connection_cap_wait_for_a_connection(
    standin: StandInBackend, started: Callable[..., Any]
) -> None:
    standin.hold = asyncio.Event()
    s = await started(one_model({"endpoint": standin.endpoint}), max_connections=2)
    backend = s.pick("m")
    chats = [
        asyncio.create_task(s.proxy(backend, Exchange(CHAT, chat_request(), {}))) for _ in range(5)
    ]
    await until(lambda: standin.inflight == 2)
    standin.hold.set()
    answers = await asyncio.gather(*chats)
    assert [a.status for a in answers] == [200] * 5
    assert standin.max_inflight == 2  # never more than the cap at the backend at once
    assert len(standin.peers) == 2  # the waiting chats went over the same two connections
    assert backend.inflight == 0 and backend.requests == 5 and backend.errors == 0


# -- a stream, chunk by chunk --------------------------------------------------------------------


async def test_a_stream_reaches_the_caller_chunk_by_chunk(
    standin: StandInBackend, started: Callable[..., Any]
) -> None:
    s = await started(one_model({"endpoint": standin.endpoint}))
    standin.gate = asyncio.Event()  # the backend holds every chunk after its first

    async def handle(request: Request) -> Response | StreamResponse:
        return await s.proxy(
            s.pick("m"), Exchange({**CHAT, "stream": True}, request, {"x-seen": "1"})
        )

    server = HttpServer(handle, max_body=1 << 20, read_timeout_s=30)
    _, port = await server.listen_tcp("127.0.0.1", 0)
    try:
        async with (
            aiohttp.ClientSession() as client,
            client.post(f"http://127.0.0.1:{port}/v1/chat/completions", data=b"{}") as r,
        ):
            assert r.status == 200 and r.headers["x-seen"] == "1"
            assert r.headers["Content-Type"].startswith("text/event-stream")
            first = await asyncio.wait_for(r.content.readuntil(b"\n\n"), 10)
            assert b'"content": "a got:"' in first  # here while the rest is still held
            standin.gate.set()
            rest = await r.content.read()
        assert rest.endswith(b"data: [DONE]\n\n")
    finally:
        await server.close(5.0)


# -- failures before the first byte (fallback) and after it --------------------------------------


@pytest.mark.parametrize(
    ("fault", "reason", "marked"),
    [
        ("reset", "reset", True),
        ("503", "http_503", True),
        ("429", "http_429", False),
        ("stream_before_first", "stream_first_chunk", True),
    ],
)
async def test_each_failure_before_the_first_byte_is_an_attempt_failure_with_its_reason(
    standin: StandInBackend,
    started: Callable[..., Any],
    fault: str,
    reason: str,
    marked: bool,
) -> None:
    standin.fault = fault
    s = await started(one_model({"endpoint": standin.endpoint}))
    backend = s.pick("m")
    with pytest.raises(AttemptFailed) as info:
        await s.proxy(
            backend, Exchange({**CHAT, "stream": True}, chat_request(), {}, early_failure=True)
        )
    assert info.value.reason == reason
    assert (backend.health.state == "unhealthy") is marked
    assert backend.errors == 1 and backend.inflight == 0
    if reason.startswith("http_"):  # the backend's own error answer, for the last resort
        assert info.value.answer is not None and info.value.answer.status == int(fault)


async def test_a_refused_connection_is_connect_and_without_fallback_a_502(
    started: Callable[..., Any],
) -> None:
    s = await started(one_model({"endpoint": f"127.0.0.1:{free_tcp_port()}"}))
    backend = s.pick("m")
    with pytest.raises(AttemptFailed) as info:
        await s.proxy(backend, Exchange(CHAT, chat_request(), {}, early_failure=True))
    assert info.value.reason == "connect"
    assert isinstance(info.value.error, BackendUnavailable)
    with pytest.raises(BackendUnavailable, match="cannot be reached"):
        await s.proxy(backend, Exchange(CHAT, chat_request(), {}))
    assert backend.health.state == "unhealthy" and backend.errors == 2


@pytest.mark.parametrize("fault", ["slow", "stream_slow_first"])
async def test_the_callers_deadline_before_the_first_byte_is_deadline_and_not_the_backends_fault(
    standin: StandInBackend, started: Callable[..., Any], fault: str
) -> None:
    standin.fault, standin.slow_s = fault, 5.0
    s = await started(one_model({"endpoint": standin.endpoint}))
    backend = s.pick("m")
    loop = asyncio.get_running_loop()
    begun = loop.time()
    with pytest.raises(AttemptFailed) as info:
        await s.proxy(
            backend,
            Exchange(
                {**CHAT, "stream": True},
                chat_request(),
                {},
                early_failure=True,
                first_byte_timeout_s=0.3,
            ),
        )
    assert loop.time() - begun < 2.0  # the deadline covers the head and the first chunk
    assert info.value.reason == "deadline"
    assert isinstance(info.value.error, DeadlineExceeded)
    assert backend.health.state == "unknown"  # slow for this caller is not down


async def test_health_checks_follow_no_redirect(
    standin: StandInBackend, started: Callable[..., Any]
) -> None:
    other = await StandInBackend("other").start()  # healthy: following would say so
    try:
        standin.fault = "redirect"
        standin.redirect_to = f"http://{other.endpoint}/v1/models"
        s = await started(one_model({"endpoint": standin.endpoint}))
        backend = s.pick("m")
        await s.check(backend)
        assert backend.health.state == "unhealthy"
        assert backend.health.last_error == "GET /v1/models answered 302"
    finally:
        await other.stop()


# -- one client per origin -----------------------------------------------------------------------


async def test_backends_on_one_server_share_its_client_and_keep_their_paths(
    started: Callable[..., Any],
) -> None:
    s = await started(one_model({"endpoint": "127.0.0.1:9"}))
    clients = s.clients
    v1, prefix_v1 = clients.for_url("http://127.0.0.1:9/v1")
    other, prefix_other = clients.for_url("http://127.0.0.1:9/openai/v1")
    elsewhere, _ = clients.for_url("http://127.0.0.1:10/v1")
    assert v1 is other and (prefix_v1, prefix_other) == ("/v1", "/openai/v1")
    assert elsewhere is not v1
    with pytest.raises(Broken) as info:  # not a URL a backend can have: as unreachable
        clients.for_url("ftp://127.0.0.1/v1")
    assert info.value.connecting
