"""A headless Chromium driven over the DevTools protocol (a websocket), enough for a page test: open a URL, evaluate
JavaScript, wait for a condition, put a file in a file input, take a screenshot. Debian's chromium package, no
driver binary and no browser download."""

import base64
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from websockets.sync.client import connect


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


# A page test needs Debian's chromium; without it the test skips and says why
needs_chromium = pytest.mark.skipif(
    chromium() is None,
    reason="needs Debian's chromium (`apt-get install chromium`; .ci/run installs it): no chromium on PATH",
)

# As root in a container: no sandbox; and no background traffic (the network is closed here).
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1000,700",
    "--remote-debugging-port=0",
]


class Browser:
    def __init__(self, executable: str, workdir: Path):
        self.executable, self.profile = executable, Path(workdir) / "chromium-profile"
        self.proc = None
        self.ws = None
        self._id = 0
        self.events: list[dict] = []  # every event the page sent (console messages, exceptions, log entries)

    def __enter__(self) -> "Browser":
        self.profile.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [self.executable, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.is_file() or not port_file.read_text().strip():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"chromium did not start (exit {self.proc.poll()})")
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            target = next(t for t in json.loads(r.read()) if t["type"] == "page")
        self.ws = connect(target["webSocketDebuggerUrl"], max_size=2**26)
        self.send("Page.enable")
        self.send("Runtime.enable")
        return self

    def __exit__(self, *exc) -> None:
        if self.ws is not None:
            self.ws.close()
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def send(self, method: str, **params) -> dict:
        """One DevTools command; events that arrive before its answer are kept in `events`."""
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv(timeout=60))
            if "method" in message:
                self.events.append(message)
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def open(self, url: str) -> None:
        self.send("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'")

    def evaluate(self, expression: str):
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60):
        """Poll until the expression is truthy; returns its value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.1)
        raise TimeoutError(f"still false after {timeout} s: {expression}")

    def set_file(self, selector: str, path: Path) -> None:
        """Choose a file in a file input, as a person's file picker would (fires its change event)."""
        root = self.send("DOM.getDocument")["root"]["nodeId"]
        node = self.send("DOM.querySelector", nodeId=root, selector=selector)["nodeId"]
        self.send("DOM.setFileInputFiles", nodeId=node, files=[str(Path(path).resolve())])

    def screenshot(self, out: Path) -> Path:
        data = self.send("Page.captureScreenshot", format="png")["data"]
        Path(out).write_bytes(base64.b64decode(data))
        return Path(out)


@contextlib.contextmanager
def tensorboard(logdir: Path):
    """TensorBoard serving `logdir` on a free port of 127.0.0.1 for the duration: its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    try:
        deadline = time.monotonic() + 120
        for line in proc.stderr:  # "TensorBoard 2.x at http://127.0.0.1:PORT/ (Press CTRL+C to quit)"
            if found := re.search(r"(http://127\.0\.0\.1:\d+)/", line):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("TensorBoard did not say where it serves")
        else:
            raise RuntimeError(f"TensorBoard exited ({proc.wait()}) before serving")
        yield found.group(1)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


# TensorBoard's images dashboard, drawn: the attention/* tags on the page and the images loaded (their widths), null
# until there is at least one of each. Its Polymer elements keep both inside shadow roots, walked here.
TB_ATTENTION_IMAGES = """(() => {
  const all = [];
  const walk = root => root.querySelectorAll('*').forEach(e => { all.push(e); if (e.shadowRoot) walk(e.shadowRoot); });
  walk(document);
  const text = all.filter(e => e.children.length === 0).map(e => e.textContent).join(' ');
  const tags = [...new Set(text.match(/attention\\/[\\w/]+/g) || [])];
  const drawn = all.filter(e => e.tagName === 'IMG' && e.complete && e.naturalWidth > 0);
  // both tags' images (relevance and rollout), not the first to finish: the test once read the page between the two
  return tags.length && drawn.length >= 2 ? {tags, drawn: drawn.length, widths: drawn.map(i => i.naturalWidth)} : null;
})()"""
