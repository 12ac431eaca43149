"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}`` with the matching HTTP status."""

from __future__ import annotations

from polyspec.core.errors import PolyspecError

import json
from typing import Any

from fastapi.responses import JSONResponse


class RouterError(PolyspecError):
    """An error the client sees as an OpenAI error object."""

    status = 500
    type = "server_error"
    code: str | None = None
    # The reason label of ``polyspec_rejected_requests`` for an error that refuses a request before routing
    # (counted once, where the handler answers it); None for every other error.
    reject_reason: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        if code is not None:
            self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


class BadRequest(RouterError):
    status, type, code = 400, "invalid_request_error", "invalid_request"
    reject_reason = "bad_request"


class RequestTimeout(RouterError):
    """The client did not send its whole body within ``body_timeout_s`` (a slow-body, slowloris, client)."""

    status, type, code = 408, "invalid_request_error", "request_timeout"
    reject_reason = "body_timeout"


class ModelNotFound(RouterError):
    status, type, code = 404, "invalid_request_error", "model_not_found"


class BodyTooLarge(RouterError):
    status, type, code = 413, "invalid_request_error", "request_too_large"
    reject_reason = "too_large"


class UpstreamFailed(RouterError):
    status, type, code = 502, "upstream_error", "bad_gateway"


class NoBackend(RouterError):
    status, type, code = 503, "service_unavailable", "no_healthy_backend"


class RouterShutdown(RouterError):
    """The router stopped (SIGTERM) and its drain grace ended before this request got an answer."""

    status, type, code = 503, "service_unavailable", "router_shutdown"


class UpstreamTimeout(RouterError):
    status, type, code = 504, "upstream_error", "upstream_timeout"


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


STREAM_INTERRUPTED = "stream_interrupted"  # the code of a stream's clean error end (sse_error)


def sse_error(message: str, type_: str = "upstream_error", code: str = STREAM_INTERRUPTED) -> bytes:
    """The clean end of a stream that broke after its first byte: an error event, then [DONE]."""
    payload = json.dumps(error_body(message, type_, None, code))
    return f"data: {payload}\n\ndata: [DONE]\n\n".encode()
