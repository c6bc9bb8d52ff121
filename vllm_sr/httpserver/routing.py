"""From a request to its handler, and errors to the one answer.

Routes are plain dicts of path -> method -> route. ``resolve`` looks a path up as it is (the
frontend's and the workers' few fixed paths, one dict lookup per request); ``PathRoutes`` also
takes paths with ``{name}`` segments (the control socket's ``/v1/replicas/{id}/drain``) and
hands the segments over decoded. Both answer an unknown path ``NotFound`` and another method
``MethodNotAllowed`` naming the allowed ones (``Allow`` on the 405); ``answer`` runs the route
of a ``PathRoutes`` or answers that error (the frontend's dispatch, which tests serving Router
mode's routes use too)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Generic, TypeVar
from urllib.parse import unquote

from vllm_sr import wire
from vllm_sr.errors import MethodNotAllowed, NotFound, VllmSrError
from vllm_sr.httpserver.streaming import StreamResponse
from vllm_sr.httpserver.types import Request, Response

Handler = Callable[[Request], Awaitable[Response | StreamResponse]]
R = TypeVar("R")


def error_response(exc: VllmSrError) -> Response:
    """An error as the project's one JSON answer (``vllm_sr.wire``: ``Allow`` on a 405,
    ``Retry-After`` where the error asks the caller to come back)."""
    response = Response(wire.error_body(exc), exc.http_status)
    response.headers.update(wire.error_headers(exc))
    return response


def resolve(routes: Mapping[str, Mapping[str, R]], request: Request) -> R:
    """The route for the request's path and method (HEAD is GET without a body); unknown
    paths are ``NotFound``, other methods ``MethodNotAllowed``."""
    by_method = routes.get(request.path)
    if by_method is None:
        raise NotFound(f"{request.path}: no such path")
    return _by_method(by_method, request)


def _by_method(by_method: Mapping[str, R], request: Request) -> R:
    method = "GET" if request.method == "HEAD" else request.method
    route = by_method.get(method)
    if route is None:
        allowed = sorted(by_method)
        raise MethodNotAllowed(
            f"{request.method} {request.path}: not allowed; use {' or '.join(allowed)}",
            allowed=allowed,
        )
    return route


async def answer(paths: PathRoutes[Handler], request: Request) -> Response | StreamResponse:
    """The answer of the request's route; an unknown path or another method is answered as the
    one JSON error (404, 405 with ``Allow``) rather than raised to the server (a 500)."""
    try:
        route, _ = paths.resolve(request)
    except VllmSrError as exc:
        return error_response(exc)
    return await route(request)


class PathRoutes(Generic[R]):
    """Routes whose paths may hold ``{name}`` segments, each matching one whole segment.
    ``resolve`` returns the route and the named segments, percent-decoded (a client quotes a
    replica id with ``quote(id, safe="")``, so an id holding a ``/`` stays one segment)."""

    def __init__(self, routes: Mapping[str, Mapping[str, R]]) -> None:
        self.exact: dict[str, Mapping[str, R]] = {}
        self.templates: list[tuple[tuple[str, ...], Mapping[str, R]]] = []
        for path, by_method in routes.items():
            if "{" in path:
                self.templates.append((tuple(path.split("/")), by_method))
            else:
                self.exact[path] = by_method

    def resolve(self, request: Request) -> tuple[R, dict[str, str]]:
        by_method = self.exact.get(request.path)
        if by_method is not None:
            return _by_method(by_method, request), {}
        segments = request.path.split("/")
        for template, by_method in self.templates:
            params = _match(template, segments)
            if params is not None:
                return _by_method(by_method, request), params
        raise NotFound(f"{request.path}: no such path")


def _match(template: tuple[str, ...], segments: list[str]) -> dict[str, str] | None:
    if len(template) != len(segments):
        return None
    params: dict[str, str] = {}
    for want, got in zip(template, segments, strict=True):
        if want.startswith("{") and want.endswith("}"):
            if not got:
                return None
            params[want[1:-1]] = unquote(got)
        elif want != got:
            return None
    return params
