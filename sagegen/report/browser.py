"""A minimal headless-Chromium driver over the DevTools protocol on pipes (``--remote-debugging-pipe``):
no websocket library, no browser download. Used to check that report.html loads without console errors,
that its players play in sync, and to screenshot it."""

from __future__ import annotations

import base64
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--mute-audio", "--hide-scrollbars", "--remote-debugging-pipe",
]


def find_chromium() -> str | None:
    env = os.environ.get("SAGEGEN_CHROMIUM")
    if env and Path(env).is_file():
        return env
    for n in CHROMIUM_NAMES:
        p = shutil.which(n)
        if p:
            return p
    return None


class CDPError(RuntimeError):
    pass


class Browser:
    """``with Browser() as b: b.open(url); b.eval("1+1")``."""

    def __init__(self, executable: str | None = None, width: int = 1400, height: int = 1000, timeout: float = 60):
        self.exe = executable or find_chromium()
        if not self.exe:
            raise FileNotFoundError("no Chromium found (apt-get install chromium, or set $SAGEGEN_CHROMIUM)")
        self.width, self.height, self.timeout = width, height, timeout
        self.events: list[dict] = []
        self._pending: dict[int, queue.Queue] = {}
        self._next = 0
        self._lock = threading.Lock()
        self.session: str | None = None

    # ------------------------------------------------------------------ process and transport
    def __enter__(self) -> "Browser":
        self.profile = tempfile.mkdtemp(prefix="sagegen-chromium-")
        import fcntl

        r, self._to_child_w = os.pipe()
        self._from_child_r, w = os.pipe()
        # park the child's ends above 4 so dup2 onto 3 and 4 never aliases (and clears close-on-exec)
        to_child_r, from_child_w = fcntl.fcntl(r, fcntl.F_DUPFD_CLOEXEC, 10), fcntl.fcntl(w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(r)
        os.close(w)

        def plumb() -> None:  # child: commands on fd 3, replies on fd 4
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)

        self.proc = subprocess.Popen(
            [self.exe, *FLAGS, f"--user-data-dir={self.profile}", f"--window-size={self.width},{self.height}",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            preexec_fn=plumb, close_fds=False,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._reader = threading.Thread(target=self._read_loop, daemon=True)
        self._reader.start()
        self._stderr: list[str] = []
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 session=False)["sessionId"]
        for dom in ("Page.enable", "Runtime.enable", "Log.enable"):
            self.send(dom)
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False})
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.send("Browser.close", session=False, timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_child_w)
        shutil.rmtree(self.profile, ignore_errors=True)

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line.decode(errors="replace"))

    def _read_loop(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._from_child_r, 1 << 16)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "id" in msg and msg["id"] in self._pending:
                    self._pending[msg["id"]].put(msg)
                else:
                    self.events.append(msg)
        os.close(self._from_child_r)

    def send(self, method: str, params: dict | None = None, session: bool = True, timeout: float | None = None) -> dict:
        with self._lock:
            self._next += 1
            mid = self._next
            q: queue.Queue = queue.Queue()
            self._pending[mid] = q
            msg: dict[str, Any] = {"id": mid, "method": method, "params": params or {}}
            if session and self.session:
                msg["sessionId"] = self.session
            os.write(self._to_child_w, json.dumps(msg).encode() + b"\0")
        try:
            reply = q.get(timeout=timeout or self.timeout)
        except queue.Empty as e:
            raise CDPError(f"{method}: no reply in {timeout or self.timeout}s; chromium said: "
                           f"{''.join(self._stderr)[-800:]}") from e
        finally:
            self._pending.pop(mid, None)
        if "error" in reply:
            raise CDPError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    # ------------------------------------------------------------------ page helpers
    def open(self, url: str, wait: float | None = None) -> None:
        n0 = len(self.events)
        self.send("Page.navigate", {"url": url})
        deadline = time.time() + (wait or self.timeout)
        while time.time() < deadline:
            if any(e.get("method") == "Page.loadEventFired" for e in self.events[n0:]):
                return
            time.sleep(0.05)
        raise CDPError(f"{url} did not finish loading in {wait or self.timeout}s")

    def eval(self, expression: str, await_promise: bool = True) -> Any:
        r = self.send("Runtime.evaluate", {"expression": expression, "awaitPromise": await_promise,
                                           "returnByValue": True})
        if "exceptionDetails" in r:
            raise CDPError(
                f"JS error in {expression[:80]!r}: "
                f"{r['exceptionDetails'].get('exception', {}).get('description') or r['exceptionDetails']}")
        return r.get("result", {}).get("value")

    def screenshot(self, full_page: bool = False) -> bytes:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            m = self.send("Page.getLayoutMetrics")
            size = m.get("cssContentSize") or m.get("contentSize")
            params.update(captureBeyondViewport=True, clip={"x": 0, "y": 0, "width": size["width"],
                                                             "height": min(size["height"], 8000), "scale": 1})
        return base64.b64decode(self.send("Page.captureScreenshot", params)["data"])

    def console_problems(self) -> list[str]:
        """Console errors/warnings, uncaught exceptions and failed loads seen so far."""
        out = []
        for ev in self.events:
            m, p = ev.get("method"), ev.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert", "warning"):
                out.append(f"console.{p['type']}: "
                           + " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif m == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                out.append(f"exception: {d.get('exception', {}).get('description') or d.get('text')}")
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append(f"log error: {p['entry'].get('text')} {p['entry'].get('url', '')}")
        return out
