"""The web chat page at ``/``: static files shipped in the package (``page/``), no build step,
nothing fetched from elsewhere, so it works offline. It talks to /v1/chat/completions like any
OpenAI client and colours each token by how it was accepted (``fly_token`` in the chunks)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, JSONResponse, Response

import fly_cpp
from fly_cpp.server import errors

FILES = Path(__file__).with_name("page")
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
# what browsers and llama-server's web UI clients ask a page server for, answered here so that
# they never meet the API key: an app manifest, a service worker that does nothing, the version
ASSETS = ("/manifest.webmanifest", "/sw.js", "/_app/version.json")
HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}


def is_page(path: str) -> bool:
    """The page's own paths, open without the API key and while the models load."""
    return path in ("/", "/index.html", *ASSETS) or path.startswith("/static/")


def router() -> APIRouter:
    r = APIRouter()
    shipped = {p.name: p for p in FILES.iterdir() if p.suffix in TYPES}

    @r.get("/", include_in_schema=False)
    @r.get("/index.html", include_in_schema=False)
    async def index() -> Response:
        return _file(shipped["index.html"])

    @r.get("/static/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        if name not in shipped:  # only the shipped files, by name: no paths
            return errors.response(404, f"no such file: {name}")
        return _file(shipped[name])

    @r.get("/manifest.webmanifest", include_in_schema=False)
    async def manifest() -> Response:
        return JSONResponse({"name": "fly-cpp", "short_name": "fly-cpp", "start_url": "/", "display": "standalone"},
                            media_type="application/manifest+json", headers=HEADERS)

    @r.get("/sw.js", include_in_schema=False)
    async def service_worker() -> Response:
        return Response("// no offline cache: the page is served by the model server itself\n",
                        media_type=TYPES[".js"], headers=HEADERS)

    @r.get("/_app/version.json", include_in_schema=False)
    async def version() -> Response:
        return JSONResponse({"version": fly_cpp.__version__}, headers=HEADERS)

    return r


def _file(path: Path) -> Response:
    return FileResponse(path, media_type=TYPES[path.suffix], headers=HEADERS)
