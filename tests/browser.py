"""Headless Chromium driven through the DevTools protocol over a pipe (`--remote-debugging-pipe`): no
WebDriver, no websocket library. Used by the UI tests and scripts/doc_figures.py to click, read what a
page shows and where, and take screenshots, as a person would at a given window width."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


class BrowserError(RuntimeError):
    pass


class ScriptError(BrowserError):
    """The page's JavaScript threw (not the browser failing)."""


class Browser:
    """One headless Chromium with one page of `width` x `height` CSS pixels and a fresh profile."""

    def __init__(self, width: int = 1400, height: int = 900) -> None:
        binary = shutil.which("chromium") or shutil.which("chromium-browser")
        if binary is None:
            raise BrowserError("chromium missing: scripts/setup.sh installs Debian's chromium")
        self._profile = tempfile.mkdtemp(prefix="privbench-chromium-")
        to_browser, self._commands = os.pipe()
        self._answers, from_browser = os.pipe()
        # The browser reads commands on fd 3 and writes answers on fd 4: copies above 10 that close on exec,
        # duplicated onto 3 and 4 in the child (every other descriptor of ours closes on exec too).
        high_in, high_out = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_browser, from_browser))

        def wire() -> None:
            os.dup2(high_in, 3)
            os.dup2(high_out, 4)

        self.proc = subprocess.Popen([binary, *FLAGS, "--remote-debugging-pipe", f"--user-data-dir={self._profile}",
                                      f"--window-size={width},{height}", "about:blank"],
                                     close_fds=False, preexec_fn=wire, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        for fd in (to_browser, from_browser, high_in, high_out):
            os.close(fd)
        self._reader = os.fdopen(self._answers, "rb", buffering=0)
        self._buffer = b""
        self._next_id = 0
        self.width, self.height = width, height
        page = next(t for t in self.call("Target.getTargets")["targetInfos"] if t["type"] == "page")
        self._session = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]
        self.call("Page.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    def call(self, method: str, session: bool = False, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self._session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        while True:
            answer = self._read()
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise BrowserError(f"{method}: {answer['error']}")
                return answer.get("result", {})

    def _read(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            chunk = self._reader.read(65536)
            if not chunk:
                raise BrowserError("chromium closed its pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise ScriptError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def open(self, url: str) -> None:
        self.call("Page.navigate", session=True, url=url)

    def wait_for(self, expression: str, timeout: float = 60.0) -> Any:
        """Poll a JavaScript condition until it is truthy (the page renders asynchronously); its value. An
        expression that throws counts as not yet (just after `open` the new page may have no body); the
        timeout's error names its last exception."""
        deadline = time.monotonic() + timeout
        error: ScriptError | None = None
        while True:
            try:
                value, error = self.evaluate(expression), None
            except ScriptError as exc:
                value, error = None, exc
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"timed out after {timeout:.0f} s waiting for {expression[:200]}"
                                   + (f" (last: {error})" if error else ""))
            time.sleep(0.2)

    def text(self) -> str:
        return self.evaluate("document.body ? document.body.innerText : ''") or ""

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", session=True, format="png")["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (BrowserError, OSError):
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
        self._reader.close()
        os.close(self._commands)
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
