"""A loopback HTTP server that serves real files the way the Hugging Face Hub does.

Enough of the Hub for huggingface_hub's hf_hub_download, list_repo_files, list_repo_tree and list_models:
HEAD and GET on /{owner}/{repo}/resolve/{revision}/{file} with ETag,
X-Repo-Commit, X-Linked-Size and Range support, the tree listing API and the model search.
It can drop the connection part-way through a file, serve slowly, refuse gated repos, send
file requests on to another server (as the Hub sends them to its CDN), and records every
request so tests can see whether a download resumed and where a token went.
"""

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"
RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<revision>[^/]+)/(?P<file>.+)$")
TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<revision>[^/?]+)")
SEARCH = re.compile(r"^/api/models(?:\?|$)")


@dataclass
class FakeHub:
    files: dict[tuple[str, str], Path] = field(default_factory=dict)  # (repo, name) -> file
    gated: set[str] = field(default_factory=set)
    drop_after: dict[str, int] = field(default_factory=dict)  # file name -> bytes sent before dropping once
    refuse_resume: set[str] = field(default_factory=set)  # file names whose ranged GETs fail
    slow: dict[str, float] = field(default_factory=dict)  # file name -> seconds to wait between 64 KiB blocks
    # file name -> the size stated for it, while all of it is sent (its GET body ends where the connection closes)
    understated: dict[str, int] = field(default_factory=dict)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)  # (method, path, Range)
    tokens: list[str | None] = field(default_factory=list)  # each request's Authorization header
    redirect: str = ""  # if set, files are answered with a 302 to the same path on this base URL (a CDN)
    downloads: dict[str, int] = field(default_factory=dict)  # repo -> its downloads, which order a search
    url: str = ""

    def add(self, repo: str, path: Path, name: str | None = None) -> None:
        self.files[(repo, name or path.name)] = path

    def gets(self, name: str) -> list[str | None]:
        """The Range header of every GET for a file name (None: from the start)."""
        return [r for method, path, r in self.requests if method == "GET" and path.endswith("/" + name)]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def serve(hub: FakeHub):
    """Start serving hub on 127.0.0.1; returns the server (call shutdown())."""
    digests: dict[Path, str] = {}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_HEAD(self):
            self.respond(send_body=False)

        def do_GET(self):
            self.respond(send_body=True)

        def respond(self, send_body: bool):
            hub.requests.append((self.command, self.path, self.headers.get("Range")))
            hub.tokens.append(self.headers.get("Authorization"))
            tree = TREE.match(self.path)
            if tree:
                return self.listing(tree["repo"])
            if SEARCH.match(self.path):
                return self.search(parse_qs(urlsplit(self.path).query))
            match = RESOLVE.match(self.path.split("?")[0])
            if not match:
                return self.error(404, "EntryNotFound", "no such path")
            repo, name = match["repo"], match["file"]
            if repo in hub.gated and not self.headers.get("Authorization"):
                return self.error(
                    401, "GatedRepo", f"Access to model {repo} is restricted. You must have access to it and be authenticated."
                )
            path = hub.files.get((repo, name))
            if path is None:
                code = "EntryNotFound" if any(r == repo for r, _ in hub.files) else "RepoNotFound"
                return self.error(404, code, f"{name} not found in {repo}")
            size = path.stat().st_size
            digest = digests.setdefault(path, _sha256(path))
            if hub.redirect:
                self.send_response(302)
                self.send_header("Location", hub.redirect + self.path)
                self.send_header("ETag", f'"{digest}"')
                self.send_header("X-Linked-Etag", f'"{digest}"')
                self.send_header("X-Linked-Size", str(size))
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("Content-Length", "0")
                return self.end_headers()
            start = 0
            wanted = self.headers.get("Range")
            if wanted and self.command == "GET" and name in hub.refuse_resume:
                return self.error(404, "EntryNotFound", "temporarily unavailable")
            if wanted:
                start = int(re.match(r"bytes=(\d+)-", wanted)[1])
            self.send_response(206 if wanted else 200)
            self.send_header("ETag", f'"{digest}"')
            self.send_header("X-Linked-Etag", f'"{digest}"')
            self.send_header("X-Linked-Size", str(hub.understated.get(name, size)))
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("Accept-Ranges", "bytes")
            if name in hub.understated and send_body:
                self.close_connection = True  # a body that ends where the connection does
            else:
                self.send_header("Content-Length", str(hub.understated.get(name, size) - start))
            if wanted:
                self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
            self.end_headers()
            if not send_body:
                return
            limit = hub.drop_after.pop(name, None)
            with open(path, "rb") as f:
                f.seek(start)
                sent = 0
                while block := f.read(1 << 16):
                    if limit is not None and sent + len(block) > limit:
                        self.wfile.write(block[: limit - sent])
                        self.wfile.flush()
                        self.close_connection = True
                        self.connection.shutdown(2)  # drop mid-body, as a flaky network does
                        return
                    self.wfile.write(block)
                    sent += len(block)
                    if name in hub.slow:
                        time.sleep(hub.slow[name])

        def listing(self, repo: str):
            if repo in hub.gated and not self.headers.get("Authorization"):
                return self.error(401, "GatedRepo", f"Access to model {repo} is restricted.")
            entries = [
                {"type": "file", "path": name, "size": path.stat().st_size, "oid": COMMIT[:40],
                 "lfs": {"oid": digests.setdefault(path, _sha256(path)), "size": path.stat().st_size, "pointerSize": 134}}
                for (r, name), path in hub.files.items() if r == repo
            ]
            if not entries:
                return self.error(404, "RepoNotFound", f"{repo} not found")
            body = json.dumps(entries).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command == "GET":
                self.wfile.write(body)

        def search(self, query: dict[str, list[str]]):
            """The Hub's model search: the repos whose names hold the text (any case) and that have GGUF files (the
            only filter asked for here), the most downloaded first, with what expand asks of each."""
            text = query.get("search", [""])[0].lower()
            repos = sorted({repo for repo, name in hub.files if text in repo.lower() and name.endswith(".gguf")},
                           key=lambda repo: (-hub.downloads.get(repo, 0), repo))
            repos = repos[:int(query.get("limit", [len(repos)])[0])]
            body = json.dumps([{"id": repo, "modelId": repo, "downloads": hub.downloads.get(repo, 0), "likes": 1,
                                "gguf": {"total": 1_500_000}} for repo in repos]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def error(self, status: int, code: str, message: str):
            body = json.dumps({"error": message}).encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command == "GET":
                self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
