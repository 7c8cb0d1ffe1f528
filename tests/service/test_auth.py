"""The token check: bearer and basic auth, loopback addresses, where the token comes from."""

from __future__ import annotations

import base64

import pytest

from replayer.errors import UsageError
from replayer.service.auth import authorized, is_loopback, load_token

pytestmark = pytest.mark.inprocess

TOKEN = "x" * 24


def test_token_checks(tmp_path, monkeypatch):
    assert authorized(f"Bearer {TOKEN}", "POST", TOKEN)
    assert not authorized(f"Bearer {TOKEN}1", "GET", TOKEN)
    assert not authorized(None, "GET", TOKEN)
    basic = "Basic " + base64.b64encode(f"u:{TOKEN}".encode()).decode()
    assert authorized(basic, "GET", TOKEN) and authorized(basic, "HEAD", TOKEN)
    assert not authorized(basic, "POST", TOKEN) and not authorized(basic, "DELETE", TOKEN)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("10.1.2.3")
    monkeypatch.delenv("REPLAYER_SERVE_TOKEN", raising=False)
    with pytest.raises(UsageError, match="refusing to listen on 0.0.0.0"):
        load_token(None, tmp_path, "0.0.0.0")
    monkeypatch.setenv("REPLAYER_SERVE_TOKEN", TOKEN)
    assert load_token(None, tmp_path, "0.0.0.0") == (TOKEN, "$REPLAYER_SERVE_TOKEN")
