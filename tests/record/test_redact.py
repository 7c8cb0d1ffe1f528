"""What is never stored: credential headers by name or value, credential fields
(but not JSON-schema properties that happen to share the name), and --redact matches."""

from __future__ import annotations

import pytest

from replayer.record.redact import MASK, Redactor, secret_header

pytestmark = pytest.mark.inprocess


def test_credential_headers_by_name_or_value():
    for name in (
        "Authorization",
        "Proxy-Authorization",
        "Cookie",
        "api-key",
        "X-API-Key",
        "x-goog-api-key",
        "X-Auth-Token",
        "OpenAI-Api-Key",
        "Ocp-Apim-Subscription-Key",
        "X-Amz-Security-Token",
        "X-Client-Secret",
    ):
        assert secret_header(name, "v"), name
    for value in ("Bearer abc", "basic Zm9vOmJhcg==", "sk-proj-0123456789abcdef"):
        assert secret_header("X-Whatever", value), value
    for name in ("User-Agent", "X-Session-Id", "Content-Type", "X-Stainless-Retry-Count"):
        assert not secret_header(name, "python/1.0"), name


def test_headers_kept_are_masked_and_dropped_by_name():
    red = Redactor(patterns=[r"acme-\d+"], drop_headers=["X-Team"])
    kept = red.headers(
        [
            ("Authorization", "Bearer s3cr3t"),
            ("X-Team", "infra"),
            ("X-Note", "ticket acme-42"),
            ("Accept", "a"),
            ("accept", "b"),
            ("Host", "h"),
        ],
        skip=["host"],
    )
    assert kept == {"x-note": f"ticket {MASK}", "accept": "a, b"}


def test_body_fields_masked_but_schemas_and_token_params_kept():
    red = Redactor()
    body = {
        "model": "m",
        "api_key": "sk-live-1",
        "max_tokens": 10,
        "skip_special_tokens": True,
        "extra": {"access_token": "tok", "nested": [{"password": "pw"}]},
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "login",
                    "parameters": {
                        "type": "object",
                        "properties": {"password": {"type": "string"}, "token": {"type": "string"}},
                    },
                },
            }
        ],
        "messages": [{"role": "user", "content": "my api_key is in here"}],
    }
    out, masked = red.body(body)
    assert masked == ["api_key", "extra.access_token", "extra.nested[].password"]
    assert out["api_key"] == MASK and out["extra"]["access_token"] == MASK
    assert out["extra"]["nested"] == [{"password": MASK}]
    assert out["tools"] == body["tools"] and out["max_tokens"] == 10
    assert out["messages"] == body["messages"]  # message text: only --redact touches it
    assert body["api_key"] == "sk-live-1"  # the original is not modified


def test_redact_patterns_reach_every_string():
    red = Redactor(patterns=[r"hunter\d", r"ACME-[A-Z]+"])
    body = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "pw hunter2 for ACME-PROD"}]}
        ],
        "prompt": "hunter3",
        "metadata": {"note": "ACME-X"},
    }
    out, masked = red.body(body)
    assert out["messages"][0]["content"][0]["text"] == f"pw {MASK} for {MASK}"
    assert out["prompt"] == MASK and out["metadata"]["note"] == MASK and masked == []
    assert red.value({"a": ["hunter1", 3, None]}) == {"a": [MASK, 3, None]}
    assert red.query([("api_key", "k"), ("q", "hunter9"), ("x", "1")]) == {
        "api_key": MASK,
        "q": MASK,
        "x": "1",
    }
    assert not Redactor().active and red.active
