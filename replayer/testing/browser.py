"""Headless Chromium over the DevTools protocol, for testing what a person sees.

The HTML report is only right if a real browser renders it: plotly.js runs,
no console error, no request leaves the machine, every chart has its series.
This drives Debian's ``chromium`` (``apt-get install chromium``) directly over
the Chrome DevTools Protocol with aiohttp's websocket client, which replayer
already depends on: no Playwright, no driver download.

Chromium runs headless, sandbox and GPU off, with every background network
feature disabled (it would otherwise call home), in a throwaway profile, on
a DevTools port of its own choosing (read back from ``DevToolsActivePort``:
no port races). Every wait is a bounded poll or a bounded await.

Usage::

    async with Chromium() as browser:
        page = await browser.new_page(width=1400, height=900)
        await page.goto(Path("report.html").resolve().as_uri())
        await page.wait_for("document.body.dataset.rendered")
        assert not page.errors
        await page.screenshot(Path("report.png"))

``python -m replayer.testing.browser REPORT.html OUT.png`` takes the
screenshot of a report (the README's).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import aiohttp
import orjson

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--hide-scrollbars",
    "--mute-audio",
    "--remote-debugging-port=0",
)


class BrowserError(RuntimeError):
    """Chromium is missing, did not start, or a page call failed."""


def find_chromium() -> str | None:
    """``$REPLAYER_CHROMIUM``, else the first Chromium on PATH."""
    env = os.environ.get("REPLAYER_CHROMIUM")
    if env:
        return env if os.access(env, os.X_OK) else None
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Page:
    """One tab, attached through a flattened DevTools session."""

    def __init__(self, browser: Chromium, session_id: str) -> None:
        self.browser = browser
        self.session_id = session_id
        self.errors: list[str] = []
        """Console errors, uncaught exceptions and error log entries, as text."""
        self.requests: list[str] = []
        """URLs of every request the page made."""
        self._loaded = asyncio.Event()

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self.browser.send(method, params, session_id=self.session_id)

    def _event(self, method: str, p: dict[str, Any]) -> None:
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            args = p.get("args") or []
            self.errors.append(
                "console: " + " ".join(str(a.get("value", a.get("description", ""))) for a in args)
            )
        elif method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails") or {}
            exc = d.get("exception") or {}
            self.errors.append(f"exception: {exc.get('description') or d.get('text')}")
        elif method == "Log.entryAdded":
            e = p.get("entry") or {}
            if e.get("level") == "error":
                self.errors.append(f"log: {e.get('text')} {e.get('url', '')}".strip())
        elif method == "Network.requestWillBeSent":
            self.requests.append(str((p.get("request") or {}).get("url")))
        elif method == "Page.loadEventFired":
            self._loaded.set()

    async def goto(self, url: str, limit: float = 60.0) -> None:
        """Navigate and wait (at most ``limit`` seconds) for the load event."""
        self._loaded.clear()
        res = await self.send("Page.navigate", {"url": url})
        if res.get("errorText"):
            raise BrowserError(f"navigating to {url}: {res['errorText']}")
        async with asyncio.timeout(limit):
            await self._loaded.wait()

    async def evaluate(self, expression: str) -> Any:
        """The value of a JS expression (promises awaited)."""
        res = await self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in res:
            raise BrowserError(f"{expression!r} threw: {res['exceptionDetails'].get('text')}")
        return (res.get("result") or {}).get("value")

    async def wait_for(self, expression: str, limit: float = 60.0) -> Any:
        """Poll until ``expression`` is truthy (at most ``limit`` seconds)."""
        deadline = time.monotonic() + limit
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"{expression!r} still falsy after {limit:g} s: {self.errors}")
            await asyncio.sleep(0.05)

    async def screenshot(self, path: Path, *, full_page: bool = True) -> None:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            m = await self.send("Page.getLayoutMetrics")
            size = m.get("cssContentSize") or m["contentSize"]
            params["clip"] = {
                "x": 0,
                "y": 0,
                "width": size["width"],
                "height": size["height"],
                "scale": 1,
            }
            params["captureBeyondViewport"] = True
        res = await self.send("Page.captureScreenshot", params)
        await asyncio.to_thread(path.write_bytes, base64.b64decode(res["data"]))


class Chromium:
    """A headless Chromium process and its DevTools connection."""

    def __init__(self, binary: str | None = None, *, start_timeout: float = 30.0) -> None:
        found = binary or find_chromium()
        if found is None:
            raise BrowserError(
                "Chromium not found: install it (apt-get install -y chromium; .ci/run does) "
                "or set REPLAYER_CHROMIUM"
            )
        self.binary = found
        self.start_timeout = start_timeout
        self._dir = Path(tempfile.mkdtemp(prefix="replayer-chromium-"))
        self._proc: asyncio.subprocess.Process | None = None
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task[None] | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._pages: dict[str, Page] = {}

    async def start(self) -> Self:
        from replayer._async import spawn

        with open(os.path.join(self._dir, "stderr.log"), "wb") as err:  # noqa: ASYNC230
            self._proc = await asyncio.create_subprocess_exec(
                self.binary,
                *FLAGS,
                f"--user-data-dir={self._dir}",
                "about:blank",
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
            )
        port_file = os.path.join(self._dir, "DevToolsActivePort")
        deadline = time.monotonic() + self.start_timeout
        lines: list[str] = []
        while len(lines) < 2:
            if self._proc.returncode is not None:
                raise BrowserError(f"{self.binary} exited with {self._proc.returncode}: "
                                   f"{self._stderr_tail()}")  # fmt: skip
            if time.monotonic() > deadline:
                raise BrowserError(f"{self.binary} gave no DevTools port in {self.start_timeout}s")
            with contextlib.suppress(FileNotFoundError), open(port_file) as f:  # noqa: ASYNC230
                lines = f.read().split()
            await asyncio.sleep(0.05)
        url = f"ws://127.0.0.1:{lines[0]}{lines[1]}"
        self._http = aiohttp.ClientSession()
        self._ws = await self._http.ws_connect(url, max_msg_size=0)
        self._reader = spawn(self._read(), name="chromium-devtools")
        return self

    def _stderr_tail(self) -> str:
        try:
            with open(os.path.join(self._dir, "stderr.log"), errors="replace") as f:
                return f.read()[-600:]
        except OSError:
            return ""

    async def _read(self) -> None:
        assert self._ws is not None
        async for msg in self._ws:
            if msg.type is not aiohttp.WSMsgType.TEXT:
                continue
            m = orjson.loads(msg.data)
            if "id" in m:
                fut = self._pending.pop(m["id"], None)
                if fut is not None and not fut.done():
                    if "error" in m:
                        fut.set_exception(BrowserError(str(m["error"])))
                    else:
                        fut.set_result(m.get("result") or {})
            elif (page := self._pages.get(m.get("sessionId", ""))) is not None:
                page._event(m.get("method", ""), m.get("params") or {})
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(BrowserError("the DevTools connection closed"))

    async def send(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        session_id: str | None = None,
        limit: float = 120.0,
    ) -> dict[str, Any]:
        if self._ws is None:
            raise BrowserError("Chromium not started")
        i = next(self._ids)
        msg: dict[str, Any] = {"id": i, "method": method, "params": params or {}}
        if session_id:
            msg["sessionId"] = session_id
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[i] = fut
        await self._ws.send_str(orjson.dumps(msg).decode())
        async with asyncio.timeout(limit):
            return await fut

    async def new_page(self, width: int = 1400, height: int = 900) -> Page:
        target = await self.send("Target.createTarget", {"url": "about:blank"})
        att = await self.send(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
        )
        page = Page(self, att["sessionId"])
        self._pages[page.session_id] = page
        for domain in ("Page", "Runtime", "Log", "Network"):
            await page.send(f"{domain}.enable")
        await page.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        return page

    async def close(self) -> None:
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await self.send("Browser.close", limit=5)
            await self._ws.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._http is not None:
            await self._http.close()
        if self._proc is not None:
            try:
                async with asyncio.timeout(5):
                    await self._proc.wait()
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._proc.pid, 9)
                await self._proc.wait()
        await asyncio.to_thread(shutil.rmtree, self._dir, True)

    async def __aenter__(self) -> Self:
        try:
            return await self.start()
        except BaseException:
            await self.close()
            raise

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


async def screenshot_report(
    report: Path, out: Path, *, width: int = 1400, height: int = 900
) -> list[str]:
    """A full-page PNG of a rendered report; the page's errors (empty: none)."""
    url = await asyncio.to_thread(lambda: report.resolve().as_uri())
    async with Chromium() as browser:
        page = await browser.new_page(width=width, height=height)
        await page.goto(url)
        await page.wait_for("document.body.dataset.rendered")
        await page.screenshot(out)
        return page.errors


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m replayer.testing.browser REPORT.html OUT.png", file=sys.stderr)
        return 2
    errors = asyncio.run(screenshot_report(Path(args[0]), Path(args[1])))
    for e in errors:
        print(e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
