"""Error objects in every shape servers send (VLLM.md §2.2, §4.1)."""

from __future__ import annotations

import pytest

from replayer.wire import ErrorInfo, error_info, error_message

pytestmark = pytest.mark.inprocess


@pytest.mark.parametrize(
    ("obj", "want"),
    [
        (
            {"error": {"message": "m", "type": "BadRequestError", "param": None, "code": 400}},
            ErrorInfo("m", "BadRequestError", 400),
        ),
        (
            {"object": "error", "message": "m", "type": "BadRequestError", "code": 400},
            ErrorInfo("m", "BadRequestError", 400),
        ),
        (
            {"type": "error", "error": {"type": "overloaded_error", "message": "m"}},
            ErrorInfo("m", "overloaded_error"),
        ),
        (
            {"type": "error", "code": "ERR", "message": "m", "param": None},
            ErrorInfo("m", None, "ERR"),
        ),
        ({"error": "Unauthorized"}, ErrorInfo("Unauthorized")),
        (
            {"error": {"message": "", "type": "InternalServerError", "code": 500}},
            ErrorInfo("", "InternalServerError", 500),
        ),
        ({"error": {"code": 500}}, ErrorInfo('{"code":500}', None, 500)),
        ({"error": None, "choices": []}, None),
        ({"choices": []}, None),
        ({"detail": "Not Found"}, None),
    ],
)
def test_error_info(obj, want):
    assert error_info(obj) == want


@pytest.mark.parametrize(
    ("payload", "want"),
    [
        (
            b'{"error":{"message":"no such model","type":"NotFoundError","code":404}}',
            "no such model",
        ),
        (b'{"object":"error","message":"old","code":400}', "old"),
        (b'{"error":"Unauthorized"}', "Unauthorized"),
        (b'{"detail":"Method Not Allowed"}', "Method Not Allowed"),
        (b"Internal Server Error", "Internal Server Error"),
        (b'{"other":1}', '{"other":1}'),
        (b"x" * 600, "x" * 500),
    ],
)
def test_error_message(payload, want):
    assert error_message(payload) == want
    assert len(error_message(b'{"error":"' + b"y" * 3000 + b'"}')) == 2000
