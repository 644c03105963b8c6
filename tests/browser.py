"""A real headless Chromium, driven over the DevTools protocol through a pipe (no extra packages).

Chromium's ``--remote-debugging-pipe`` reads NUL-terminated JSON commands on fd 3 and writes
responses and events on fd 4. That is all a test needs to open a page, run its JavaScript,
click its buttons and read what it shows.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time

__all__ = ["Browser"]


def _above(fd: int, low: int) -> int:
    import fcntl

    new = fcntl.fcntl(fd, fcntl.F_DUPFD, low)
    os.close(fd)
    return new


class Browser:
    def __init__(self, exe: str):
        self._profile = tempfile.mkdtemp(prefix="avatar-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # Give the child's ends numbers above 3 and 4, so the shell's redirections below cannot
        # overwrite one with the other.
        to_child_r, from_child_w = (_above(fd, 5) for fd in (to_child_r, from_child_w))

        args = [
            exe,
            "--headless=new",
            "--remote-debugging-pipe",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            f"--user-data-dir={self._profile}",
            "about:blank",
        ]
        # bash puts the pipe ends on fd 3 (commands in) and fd 4 (responses out), then
        # becomes Chromium; no preexec hook, so no fork of this (multithreaded) process.
        script = f'exec "$@" 3<&{to_child_r} 4>&{from_child_w}'
        self.proc = subprocess.Popen(
            ["/bin/bash", "-c", script, "bash", *args],
            pass_fds=(to_child_r, from_child_w),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._next = 0
        self._session: str | None = None

    def _send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 30) -> dict:
        self._next += 1
        msg = {"id": self._next, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            while b"\0" not in self._buf:
                chunk = os.read(self._from_child, 1 << 16)
                if not chunk:
                    raise RuntimeError("Chromium closed the DevTools pipe")
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
        raise TimeoutError(f"{method}: no reply in {timeout}s")

    def open(self, url: str) -> None:
        target = self._send("Target.createTarget", {"url": url})["targetId"]
        self._session = self._send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.wait_for(f"location.href === {json.dumps(url)} && document.readyState === 'complete'")

    def eval(self, expression: str):
        res = self._send(
            "Runtime.evaluate",
            {"expression": expression, "awaitPromise": True, "returnByValue": True},
            session=self._session,
        )
        if "exceptionDetails" in res:
            raise RuntimeError(f"page script failed: {res['exceptionDetails'].get('text')} in {expression!r}")
        return res.get("result", {}).get("value")

    def wait_for(self, condition: str, timeout: float = 20):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                value = self.eval(condition)
            except RuntimeError:  # the page is still loading: elements not there yet
                value = None
            if value:
                return value
            time.sleep(0.05)
        raise TimeoutError(f"page never satisfied {condition!r}")

    def close(self) -> None:
        try:
            self._send("Browser.close", timeout=5)
        except Exception:  # noqa: BLE001 - closing anyway
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self._profile, ignore_errors=True)
