"""The end-to-end test's users (tests/adapt/fleet.py): they count requests in a time window, refuse empty prompt
lists, and name a stream the router ended cleanly apart from other failures."""

from __future__ import annotations

import httpx
import pytest

from polyspec.router.errors import sse_error
from tests.adapt.fleet import BROKEN_STREAM, Traffic, ended_by_router


def test_traffic_counts_a_window_and_refuses_empty_prompt_lists() -> None:
    traffic = Traffic("http://127.0.0.1:9", ["ciao"], ["hello"])
    traffic.log = [(100.0, True), (101.0, False), (105.0, True), (200.0, True)]
    assert traffic.between(100.0, 105.0) == (3, 1) and traffic.requests == 4
    with pytest.raises(ValueError, match="0 it, 1 en"):  # no prompts: refused, not threads that die at once
        Traffic("http://127.0.0.1:9", [], ["hello"])


def test_a_stream_the_router_ended_is_named_apart_from_a_cut_one() -> None:
    bodies = {"clean": b'data: {"choices": []}\n\n' + sse_error("engine died"),
              "cut": b'data: {"choices": []}\n\n', "fine": b'data: {"choices": []}\n\ndata: [DONE]\n\n'}
    for name, body in bodies.items():
        seen = Traffic("http://r", ["ciao"], ["hello"])
        transport = httpx.MockTransport(lambda req, body=body: httpx.Response(
            200, content=body, headers={"x-polyspec-backend": "canary"}))
        with httpx.Client(transport=transport) as client:
            seen._one(client, "it", "ciao", stream=True)
        assert seen.backends == {"it:canary": 1}
        if name == "clean":  # named apart: the one failure an engine killed mid-stream may cause
            assert seen.failures == [f"it {BROKEN_STREAM} on canary"]
        elif name == "cut":  # a stream that just stops is a failure of another kind
            assert len(seen.failures) == 1 and seen.failures[0].startswith("it HTTP 200")
        else:
            assert seen.failures == []


def test_the_routers_clean_stream_end_is_read_as_events() -> None:
    compact = 'data: {"error":{"code":"stream_interrupted"}}\n\ndata: [DONE]\n\n'  # spacing is not the test
    assert ended_by_router(compact) and ended_by_router(sse_error("x").decode())
    for other in ('data: {"error": {"code": "upstream_timeout"}}\n\ndata: [DONE]\n\n',  # another error
                  'data: {"error": {"code": "stream_interrupted"}}\n\n',  # no [DONE] after it
                  'data: {"error": {"code": "stream_interrupted"}}\n\ndata: {"choices": []}\n\ndata: [DONE]\n\n',
                  'data: [1, 2]\n\ndata: [DONE]\n\n', 'data: "error"\n\ndata: [DONE]\n\n', 'data: {\n\ndata: [DONE]\n\n',
                  '{"code": "stream_interrupted"} [DONE]'):
        assert not ended_by_router(other), other
