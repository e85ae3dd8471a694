"""A real browser (headless Chromium) on a web page of another origin calls serve's API, as a web UI
does: the preflight, the API key, a streamed chat read piece by piece; and a page of an origin that was
not named is kept from the answer by the browser itself.

Chromium comes from Debian's package (`.ci/run` installs it); without it these tests are skipped,
except in CI, where its absence is a failure."""

import http.server
import json
import os
import queue
import shutil
import signal
import subprocess
import threading

import pytest

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
        browser = subprocess.Popen(
            [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--host-resolver-rules=MAP *.example.test 127.0.0.1",
             f"http://{host}:{self.port}/"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            return self.reports.get(timeout=REPORT_SECONDS)
        finally:
            os.killpg(browser.pid, signal.SIGKILL)
            browser.wait(timeout=30)

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
