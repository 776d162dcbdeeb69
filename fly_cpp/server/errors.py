"""Errors as OpenAI-style JSON bodies: ``{"error": {"message", "type", "code"}}``.

Every request error is a 400 with type ``invalid_request_error`` (FastAPI's 422 included); the
server keeps serving after any of them. A request the server cannot take now (models loading,
queue full, shutting down, a lost rpc-server) is a 503 ``unavailable_error``.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from fly_cpp.basics.errors import CacheFull, ContextExceeded, FlyError, RpcServerLost
from fly_cpp.server.worker import Unavailable

TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
         405: "invalid_request_error", 408: "timeout_error", 413: "invalid_request_error", 500: "server_error", 501: "not_supported_error",
         503: "unavailable_error"}


def status_of(exc: BaseException) -> int:
    """The HTTP status an exception raised while serving a request stands for."""
    if isinstance(exc, (Unavailable, RpcServerLost)):
        return 503
    if isinstance(exc, CacheFull):
        return 500
    return 400 if isinstance(exc, (FlyError, TypeError)) else 500


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def body(status: int, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": TYPES.get(status, "invalid_request_error"), "code": status}}


def of(exc: BaseException) -> dict[str, Any]:
    """The error body of an exception raised while serving a request (a prompt longer than the
    context: llama-server's ``exceed_context_size_error``, with ``n_prompt_tokens`` and ``n_ctx``)."""
    out = body(status_of(exc), one_line(exc))
    if isinstance(exc, ContextExceeded):
        out["error"].update(type="exceed_context_size_error", n_prompt_tokens=exc.n_prompt_tokens, n_ctx=exc.n_ctx)
    return out


def response(status: int, message: str, close: bool = False) -> JSONResponse:
    """An error response; ``close``: end the connection after it (a body was left unread)."""
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
    if close:
        headers["Connection"] = "close"
    return JSONResponse(body(status, message), status_code=status, headers=headers or None)


def describe(errors: list[Any]) -> str:
    """One line from pydantic's error list: the first problem, named by its field."""
    e = errors[0]
    loc = [str(p) for p in e.get("loc", ()) if p != "body"]
    where = ".".join(loc)
    kind = e.get("type")
    if kind == "json_invalid":
        return f"the body is not valid JSON: {e.get('ctx', {}).get('error', e.get('msg'))}"
    if kind == "extra_forbidden":
        return f"unknown field {where!r}"
    if kind == "missing":  # the whole body missing (an empty POST) is where nothing is named
        return f"missing field {where!r}" if where else "the request has no body: send a JSON object"
    if kind == "model_attributes_type":
        return "the body must be a JSON object"
    if kind == "value_error" and not where:  # a check on the whole body (e.g. invalid Unicode)
        return str(e.get("msg", "")).removeprefix("Value error, ")
    # every branch of a union failed (loc: field, branch, ...): name the accepted types
    branches = [str(x["loc"][2]) for x in errors if len(x.get("loc", ())) > 2 and str(x["loc"][1]) == loc[0]]
    if len(errors) > 1 and len(branches) == len(errors):
        return f"{loc[0]}: expected {' or '.join(dict.fromkeys(branches))}"
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return f"{where}: {e.get('msg', 'invalid value')}{more}" if where else f"{e.get('msg')}{more}"


def install(app: FastAPI, on_server_error: Any) -> None:
    """Turn validation errors, FlyError and TypeError (how ``Fly`` refuses a request before any
    token) and HTTP errors into the JSON shape;
    ``on_server_error()`` is called for anything unexpected (the 500s)."""

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return response(400, describe(list(exc.errors())))

    @app.exception_handler(FlyError)
    @app.exception_handler(TypeError)
    async def refused(request: Request, exc: Exception) -> JSONResponse:
        status = status_of(exc)  # 400, but 500 for the server's own limits (CacheFull)
        if status >= 500:
            on_server_error()
        return JSONResponse(of(exc), status_code=status)

    @app.exception_handler(Unavailable)
    @app.exception_handler(RpcServerLost)
    async def unavailable(request: Request, exc: Exception) -> JSONResponse:
        return response(503, one_line(exc))

    @app.exception_handler(HTTPException)
    async def http(request: Request, exc: HTTPException) -> JSONResponse:
        return response(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception) -> JSONResponse:
        on_server_error()
        return response(500, f"internal error: {type(exc).__name__}: {exc}")
