"""A real browser (headless Chromium) on a web page of another origin calls serve's API, as a web UI
does: the preflight, the API key, a streamed chat read piece by piece; and a page of an origin that was
not named is kept from the answer by the browser itself.

Chromium comes from Debian's package (`.ci/run` installs it); without it these tests are skipped,
except in CI, where its absence is a failure."""

import base64
import http.server
import io
import json
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
import websocket

from test_server import ServerProcess

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
REPORT_SECONDS = 90

if BROWSER is None and not os.environ.get("CI"):
    pytest.skip("no chromium on this machine (Debian: apt-get install chromium)", allow_module_level=True)

PAGE = """<!doctype html>
<title>a web UI</title>
<script>
async function ask() {
  try {
    const response = await fetch(API + "/chat/completions", {
      method: "POST",
      headers: {"Authorization": "Bearer " + KEY, "Content-Type": "application/json"},
      body: JSON.stringify({model: "tiny", stream: true, max_tokens: 6,
                            messages: [{role: "user", content: "hi"}]}),
    });
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let text = "", chunks = 0;
    for (;;) {
      const {done, value} = await reader.read();
      if (done) break;
      text += decoder.decode(value, {stream: true});
      chunks += 1;
    }
    const events = text.split("\\n").filter(line => line.startsWith("data: ") && line !== "data: [DONE]")
                       .map(line => JSON.parse(line.slice(6)));
    const content = events.map(e => (e.choices[0] && e.choices[0].delta.content) || "").join("");
    return {status: response.status, chunks, events: events.length, content, done: text.includes("data: [DONE]")};
  } catch (error) {
    return {blocked: String(error)};
  }
}
ask().then(result => fetch("/report", {method: "POST", body: JSON.stringify(result)}));
</script>
"""


class Chromium:
    """Headless Chromium on a profile of its own, in a process group of its own (the kill that stops it stops
    its children), with a scratch folder of its own, removed when it stops: the kill leaves its socket's
    folder behind (each run left some in /tmp). The folder's path is short: a socket's is at most 107 bytes."""

    def __init__(self, profile: Path, *arguments: str):
        self.scratch = tempfile.TemporaryDirectory(prefix="chromium-")
        self.process = subprocess.Popen(
            [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
             "--disable-background-networking", "--disable-component-update", f"--user-data-dir={profile}",
             *arguments],
            env=os.environ | {"TMPDIR": self.scratch.name}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)

    def stop(self):
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        self.scratch.cleanup()

class _Origin:
    """The web page's own server (another origin than the API's): it serves the page, which calls the
    API at `api` with `key`, and takes the page's report of what its fetch got."""

    def __init__(self):
        self.api, self.key = "", ""
        self.reports: queue.Queue = queue.Queue()
        origin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                page = PAGE.replace("API", json.dumps(origin.api), 1).replace("KEY", json.dumps(origin.key), 1)
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(page.encode())))
                self.end_headers()
                self.wfile.write(page.encode())

            def do_POST(self):
                origin.reports.put(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.http.server_address[1]
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def visit(self, host: str, profile) -> dict:
        """What the page reports after Chromium loads it from http://host:port/ (app.example.test and
        elsewhere.example.test are this machine)."""
        browser = Chromium(profile, "--disable-quic", "--host-resolver-rules=MAP *.example.test 127.0.0.1",
                           f"http://{host}:{self.port}/")
        try:
            return self.reports.get(timeout=REPORT_SECONDS)
        finally:
            browser.stop()

    def close(self):
        self.http.shutdown()
        self.http.server_close()


def test_a_page_on_a_named_origin_streams_a_chat_and_one_elsewhere_is_kept_from_it(tiny, tmp_path):
    assert BROWSER is not None, "CI installs chromium (.ci/run): this test must run there"
    page = _Origin()
    server = ServerProcess(tmp_path / "home", tiny["target"], "--no-draft", "--alias", "tiny", "--api-key", "k",
                           "--temp", "0", "--cors-origin", f"http://app.example.test:{page.port}")
    try:
        page.api = server.url
        page.key = "k"
        answered = page.visit("app.example.test", tmp_path / "profile-1")
        assert answered["status"] == 200 and answered["done"], answered
        assert answered["events"] >= 6 and answered["content"], answered  # streamed piece by piece

        page.key = "wrong"  # the browser lets the page read the refusal, as it would any answer
        assert page.visit("app.example.test", tmp_path / "profile-2")["status"] == 401

        page.key = "k"  # a page of an origin not named: the browser keeps the answer from it
        kept = page.visit("elsewhere.example.test", tmp_path / "profile-3")
        assert "blocked" in kept, kept
        assert "Traceback" not in server.log()
    finally:
        page.close()
        assert server.stop(signal.SIGTERM) == 0, server.log()


class DevTools:
    """Headless Chromium on a page, driven over the DevTools protocol as a user would use it: read the
    page, type, click, take a screenshot."""

    def __init__(self, url: str, profile):
        self.browser = Chromium(profile, "--window-size=1200,800", "--remote-debugging-port=0", url)
        active = profile / "DevToolsActivePort"
        deadline = time.monotonic() + REPORT_SECONDS
        while not (active.exists() and active.read_text().count("\n") >= 1) and time.monotonic() < deadline:
            time.sleep(0.1)
        port = active.read_text().split()[0]
        while time.monotonic() < deadline:
            pages = [t for t in json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list").read())
                     if t["type"] == "page"]
            if pages:
                break
            time.sleep(0.1)
        self.socket = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=REPORT_SECONDS,
                                                  suppress_origin=True)
        self.calls = 0

    def call(self, method: str, **params) -> dict:
        self.calls += 1
        self.socket.send(json.dumps({"id": self.calls, "method": method, "params": params}))
        while True:
            answer = json.loads(self.socket.recv())
            if answer.get("id") == self.calls:
                return answer["result"]

    def value(self, expression: str):
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def wait_for(self, expression: str, seconds: float = REPORT_SECONDS):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            found = self.value(expression)
            if found:
                return found
            time.sleep(0.1)
        raise AssertionError(f"the page never showed {expression}: {self.value('document.body.innerText')}")

    def screenshot(self, path) -> np.ndarray:
        png = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        path.write_bytes(png)
        return plt.imread(io.BytesIO(png))[..., :3]

    def close(self):
        self.socket.close()
        self.browser.stop()


def shows(image: np.ndarray, colour: str) -> int:
    """How many pixels of a screenshot are (nearly) this CSS colour."""
    wanted = np.array([int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    return int((np.abs(image - wanted).max(axis=2) < 0.08).sum())


def test_serves_page_streams_a_reply_marks_drafted_tokens_and_sets_plain_beside_it(tiny, tmp_path):
    assert BROWSER is not None, "CI installs chromium (.ci/run): this test must run there"
    server = ServerProcess(tmp_path / "home", tiny["target"], "--draft", tiny["same"], "--spec", "fixed", "--p-min", "0",
                           "--temp", "0", "-c", "512", "--alias", "tiny", "-n", "24")
    page = DevTools(server.base + "/", tmp_path / "profile")
    try:
        assert "partial.gguf" not in page.wait_for("document.getElementById('model').textContent.includes('target')"
                                                   " && document.getElementById('model').textContent")
        empty = page.screenshot(tmp_path / "loaded.png")
        assert shows(empty, "#1565c0") < 50  # no drafted token shown yet
        page.value("document.getElementById('plain').click();"
                   "document.getElementById('prompt').value = 'the cat sat on the mat';"
                   "document.getElementById('ask').requestSubmit()")
        line = page.wait_for("document.querySelector('.reply .line') && document.querySelector('.reply .line').textContent")
        assert line.startswith("24 tokens"), line
        drafted = page.value("document.querySelectorAll('.reply .tok.drafted.draft').length")
        own = page.value("document.querySelectorAll('.reply .tok:not(.drafted)').length")
        assert drafted > own > 0  # the draft model agrees with the target: most tokens came from its drafts
        assert float(page.value("document.getElementById('per-pass').textContent")) > 1.5
        assert page.value("document.querySelectorAll('#positions .bar').length") >= 2  # a bar per draft position
        verdict = page.wait_for("document.getElementById('verdict') && document.getElementById('verdict').textContent")
        assert "identical text" in verdict, verdict
        replied = page.screenshot(tmp_path / "replied.png")  # (kept beside the test's files when it fails)
        assert shows(replied, "#1565c0") > 200  # drafted tokens are drawn in the draft model's colour
        assert "Traceback" not in server.log()
    finally:
        page.close()
        assert server.stop(signal.SIGTERM) == 0, server.log()


def test_serves_page_drops_the_oldest_turns_past_a_full_context_and_keeps_its_box_and_figures_in_view(tiny, tmp_path):
    # every message failed once the conversation outgrew the context, until a reload; a long transcript
    # scrolled the whole page, the box and the figures out of view
    assert BROWSER is not None, "CI installs chromium (.ci/run): this test must run there"
    server = ServerProcess(tmp_path / "home", tiny["target"], "--no-draft", "--temp", "0", "-c", "256", "-n", "24")
    page = DevTools(server.base + "/", tmp_path / "profile")
    try:
        page.wait_for("document.getElementById('model').textContent.includes('target')")
        page.value("document.getElementById('plain').click()")  # (plain set beside each reply)
        for sent in range(1, 9):
            page.value(f"document.getElementById('prompt').value = '{'the cat sat on the mat and the dog ' * 6}';"
                       "document.getElementById('ask').requestSubmit()")
            page.wait_for(f"document.querySelectorAll('.reply .line').length === {sent}"
                          " && !document.getElementById('send').disabled")
        shown = page.value("document.getElementById('transcript').innerText")
        assert "dropped to fit the context of 256 tokens" in shown and "context holds" not in shown, shown
        assert page.value("document.getElementById('per-pass').textContent") == "1.00"  # (plain decoding)
        verdict = page.wait_for("document.getElementById('verdict') && document.getElementById('verdict').textContent")
        assert "(nothing was drafted: both decoded plainly" in verdict, verdict  # (not read as a speedup)
        assert page.value("document.documentElement.scrollHeight <= window.innerHeight")  # only the transcript scrolls
        assert page.value("document.getElementById('ask').getBoundingClientRect().bottom <= window.innerHeight")
        assert page.value("document.getElementById('transcript').scrollHeight > window.innerHeight")
        page.value("document.getElementById('new').click()")
        assert page.value("document.getElementById('transcript').children.length") == 0
        assert "Traceback" not in server.log()
    finally:
        page.close()
        assert server.stop(signal.SIGTERM) == 0, server.log()


@pytest.mark.parametrize("kind", ["image", "audio"])
def test_serves_page_takes_an_image_or_audio_for_a_model_that_reads_them(tiny, tmp_path, kind):
    """A model served with its projector (--mmproj): the page offers a button (Image…, or Audio… where the projector
    hears, as Qwen2-Audio's does); a file picked there goes with the next message, shown in the transcript (audio as a
    player), and the reply is the one the library gives for that file."""
    from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation
    from localspec.session import Session
    from tinyaudio import CONTEXT, wav, write_tiny_audio_text, write_tiny_qwen2a_mmproj
    from tinyvision import random_image, write_tiny_mmproj

    assert BROWSER is not None, "CI installs chromium (.ci/run): this test must run there"
    if kind == "image":
        model, projector, context, shown_as = tiny["target"], write_tiny_mmproj(tmp_path / "mmproj.gguf"), 512, "img"
        given = tmp_path / "cat.png"
        given.write_bytes(random_image(1))
    else:
        model, context, shown_as = write_tiny_audio_text(tmp_path / "text.gguf"), CONTEXT, "audio"
        projector = write_tiny_qwen2a_mmproj(tmp_path / "mmproj.gguf")
        given = tmp_path / "hum.wav"
        given.write_bytes(wav(1))
    with Session(model, None, Runtime(ctx_size=context, mmproj=str(projector)),
                 Speculation(drafting=DrafterKind.PLAIN)) as session:
        expected = session.chat(sampling=Sampling(temperature=0), limits=Limits(12)).send(
            "what is it", [given.read_bytes()]).text
    server = ServerProcess(tmp_path / "home", model, "--mmproj", projector, "--temp", "0", "-c", str(context),
                           "-n", "12", "--no-draft")
    page = DevTools(server.base + "/", tmp_path / "profile")
    try:
        page.wait_for("getComputedStyle(document.getElementById('attach')).display !== 'none'")
        assert page.value("document.getElementById('attach').textContent") == ("Image…" if kind == "image" else "Audio…")
        assert page.value("document.getElementById('pick').accept") == f"{kind}/*"
        picker = page.call("DOM.querySelector", nodeId=page.call("DOM.getDocument")["root"]["nodeId"], selector="#pick")
        page.call("DOM.setFileInputFiles", files=[str(given)], nodeId=picker["nodeId"])
        page.wait_for(f"document.querySelectorAll('#pending {shown_as}').length === 1")
        page.value("document.getElementById('prompt').value = 'what is it';"
                   "document.getElementById('ask').requestSubmit()")
        page.wait_for("document.querySelector('.reply .line') !== null")
        assert page.value(f"document.querySelectorAll('.user {shown_as}').length") == 1
        assert page.value(f"document.querySelectorAll('#pending {shown_as}').length") == 0
        shown = page.value("Array.from(document.querySelectorAll('.reply .tok')).map(t => t.textContent).join('')")
        assert shown == expected
        assert "Traceback" not in server.log()
    finally:
        page.close()
        assert server.stop(signal.SIGTERM) == 0, server.log()