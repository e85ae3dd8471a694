"""`localspec serve`'s HTTP face: a table of routes, each a path, the protocol it speaks (OpenAI's,
Anthropic's or Ollama's, localspec/protocols/) and a handler, over a pool of models and their services, on
Starlette and uvicorn (the one module that knows them).

Handlers run on the event loop and only wait: the service's worker thread generates and hands each
event over through the loop. Every answer other than 200 is the route's protocol's error object, said at
the route's one boundary, never a traceback, and the server goes on serving.
"""

import asyncio
import contextlib
import email.parser
import email.policy
import functools
import hashlib
import hmac
import http.server
import ipaddress
import json
import re
import signal
import socket
import ssl
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from importlib import resources
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect
from uvicorn.protocols.http.h11_impl import H11Protocol

from . import net, store
from .protocols import anthropic, llama_server, lmstudio, lmstudio_sdk, native, ollama, openai
from .protocols.anthropic import ANTHROPIC
from .protocols.llama_server import LLAMA_SERVER
from .protocols.native import NATIVE
from .protocols.ollama import OLLAMA
from .protocols.openai import OPENAI
from .protocols.responses import MOST_KEPT, Responses
from .protocols.shared import (ApiError, Answering, Defaults, Parsed, Protocol, api_error, choices_of, rendered,
                               tool_call_error, tool_reader)
from .config import LOOPBACK_HOSTS, Serving
from .errors import (ContextOverflow, EngineError, FetchError, InputError, LocalspecError, UnknownModel, UsageError,
                     loads_json)
from .events import Done, Reading, Token
from .pool import NoRoom, NotKnown, Pool, Served
from .request import Request as LibraryRequest
from .session import without_oldest_turns
from .sdk_sockets import SdkSocket, SocketGone
from .service import FINISHED, Embedding, Job, SlotAction

REAP_SECONDS = 1.0  # how often models idle beyond their keep-alive are looked for
WATCH_SECONDS = 0.2  # how often the generation workers are looked at
SHUTDOWN_GRACE_SECONDS = 3  # for responses to finish sending once their generations are cancelled
PULLS_AT_ONCE = 2  # Ollama's /api/pull downloading at once; the others wait their turn
FILES_FOR_OTHER_USES = 64  # of the open-file limit, kept from connections: model files, libraries, the log

# routes llama-server answers with and without /v1 (its /completions is its own completion, not /v1's)
WITHOUT_V1 = ("/v1/models", "/v1/chat/completions", "/v1/chat/completions/input_tokens", "/v1/responses",
              "/v1/responses/input_tokens", "/v1/rerank", "/v1/reranking", "/v1/audio/transcriptions")


class Server:
    def __init__(self, pool: Pool, serving: Serving, defaults: Defaults, log: Callable[[str], None]):
        self.serving = serving
        self.defaults = defaults
        self.log = log
        self.pool = pool
        self.closing = False
        # Pulls download on threads of their own, PULLS_AT_ONCE at a time: on the default executor eight slow
        # ones held every thread that model loads run on.
        self._pulls = ThreadPoolExecutor(PULLS_AT_ONCE, thread_name_prefix="localspec-pull")
        self.responses = Responses()  # keeps the responses it gave, for previous_response_id
        self._said: dict[tuple, None] = {}  # what requests asked for that serve does otherwise, said once in the log
        self.lmstudio = lmstudio.V1()  # keeps the chats it answered, for previous_response_id
        self._downloads: dict[str, lmstudio.Download] = {}  # LM Studio's download jobs, by id (the newest kept)
        # (path, method, the protocol its answers and errors speak, handler(request, client), whether it
        # asks for the API key)
        self.routes = [
            ("/", "GET", OPENAI, self.root, False),  # (and HEAD: clients probe it)
            ("/health", "GET", OPENAI, self.health, False),
            ("/v1/health", "GET", OPENAI, self.health, False),
            ("/v1/models", "GET", OPENAI, self.models, True),
            ("/v1/models/{name:path}", "GET", OPENAI, self.model, True),
            ("/v1/chat/completions", "POST", OPENAI, functools.partial(self.openai_generate, chat=True), True),
            ("/v1/chat/completions/input_tokens", "POST", OPENAI,
             functools.partial(self.input_tokens, protocol=OPENAI), True),
            ("/v1/completions", "POST", OPENAI, functools.partial(self.openai_generate, chat=False), True),
            ("/metrics", "GET", OPENAI, self.metrics, True),
            ("/v1/embeddings", "POST", OPENAI, self.embeddings, True),
            ("/v1/audio/transcriptions", "POST", OPENAI, self.transcriptions, True),
            ("/embedding", "POST", LLAMA_SERVER, self.llama_embeddings, True),
            ("/embeddings", "POST", LLAMA_SERVER, self.llama_embeddings, True),
            ("/v1/rerank", "POST", LLAMA_SERVER, self.rerank, True),
            ("/v1/reranking", "POST", LLAMA_SERVER, self.rerank, True),
            ("/v2/rerank", "POST", LLAMA_SERVER, self.rerank, True),  # (Cohere's client, v2)
            ("/api/embed", "POST", OLLAMA, self.ollama_embed, True),
            ("/api/embeddings", "POST", OLLAMA, self.ollama_embeddings, True),
            ("/api/version", "GET", OLLAMA, self.ollama_version, False),
            ("/api/tags", "GET", OLLAMA, self.ollama_tags, True),
            ("/api/ps", "GET", OLLAMA, self.ollama_ps, True),
            ("/api/show", "POST", OLLAMA, self.ollama_show, True),
            ("/api/chat", "POST", OLLAMA, functools.partial(self.ollama_generate, chat=True), True),
            ("/api/generate", "POST", OLLAMA, functools.partial(self.ollama_generate, chat=False), True),
            ("/api/pull", "POST", OLLAMA, self.ollama_pull, True),
            ("/api/create", "POST", OLLAMA, self.ollama_create, True),
            ("/api/copy", "POST", OLLAMA, self.ollama_copy, True),
            ("/api/delete", "DELETE", OLLAMA, self.ollama_delete, True),
            ("/api/blobs/{digest}", "POST", OLLAMA, self.ollama_blob_upload, True),
            ("/api/blobs/{digest}", "HEAD", OLLAMA, self.ollama_blob_there, True),
            ("/v1/responses", "POST", self.responses, self.responses_create, True),
            ("/v1/responses/input_tokens", "POST", self.responses,
             functools.partial(self.input_tokens, protocol=self.responses), True),
            ("/v1/messages", "POST", ANTHROPIC, self.anthropic_messages, True),
            ("/v1/messages/count_tokens", "POST", ANTHROPIC, self.anthropic_count_tokens, True),
            ("/completion", "POST", LLAMA_SERVER, self.llama_completion, True),
            ("/infill", "POST", LLAMA_SERVER, self.llama_infill, True),
            ("/tokenize", "POST", LLAMA_SERVER, self.llama_tokenize, True),
            ("/detokenize", "POST", LLAMA_SERVER, self.llama_detokenize, True),
            ("/props", "GET", LLAMA_SERVER, self.llama_props, True),
            ("/slots", "GET", LLAMA_SERVER, self.llama_slots, True),
            ("/slots/{id_slot}", "POST", LLAMA_SERVER, self.llama_slot_action, True),
            ("/lora-adapters", "GET", LLAMA_SERVER, self.lora_adapters, True),
            ("/lora-adapters", "POST", LLAMA_SERVER, self.set_lora_adapters, True),
            ("/tokenizer_info", "GET", LLAMA_SERVER, self.tokenizer_info, True),  # (vLLM's)
            ("/apply-template", "POST", LLAMA_SERVER, self.llama_apply_template, True),
            ("/completions", "POST", LLAMA_SERVER, self.llama_completion, True),  # (llama-server's own, not OpenAI's)
            ("/lmstudio-greeting", "GET", OPENAI, self.lmstudio_greeting, False),  # (LM Studio's SDKs, then sockets)
            ("/api/v0/models", "GET", OPENAI, self.lmstudio_models, True),
            ("/api/v0/models/{name:path}", "GET", OPENAI, self.lmstudio_model, True),
            ("/api/v0/chat/completions", "POST", OPENAI,
             functools.partial(self.openai_generate, chat=True, stats=True), True),
            ("/api/v0/completions", "POST", OPENAI,
             functools.partial(self.openai_generate, chat=False, stats=True), True),
            ("/api/v0/embeddings", "POST", OPENAI, self.embeddings, True),
            ("/api/v1/models", "GET", self.lmstudio, self.lmstudio_v1_models, True),
            ("/api/v1/chat", "POST", self.lmstudio, self.lmstudio_chat, True),
            ("/api/v1/models/load", "POST", self.lmstudio, self.lmstudio_load, True),
            ("/api/v1/models/unload", "POST", self.lmstudio, self.lmstudio_unload, True),
            ("/api/v1/models/download", "POST", self.lmstudio, self.lmstudio_download, True),
            ("/api/v1/models/download/status/{job_id}", "GET", self.lmstudio, self.lmstudio_download_status, True),
            (native.PATH, "POST", NATIVE, self.native_generate, True),
            (native.INFO_PATH, "GET", NATIVE, self.native_info, True),
            (native.TOKENS_PATH, "POST", NATIVE, self.native_tokens, True),
        ]
        # llama-server's spellings without /v1, which a client given its address without it calls
        self.routes += [(path.removeprefix("/v1"), *rest) for path, *rest in self.routes if path in WITHOUT_V1]
        not_http = {404: self._not_found, 405: self._not_found}
        sockets = [WebSocketRoute(f"/{namespace}", functools.partial(self.sdk_socket, namespace))
                   for namespace in lmstudio_sdk.NAMESPACES]
        self.sdk_uploads = lmstudio_sdk.Uploads()  # images LM Studio's SDK uploaded, by the client that did
        self.app = Starlette(routes=[self._route(*route) for route in self.routes] + sockets,
                             exception_handlers=not_http,
                             middleware=[Middleware(_SameSite, serving=serving, routes=self.routes),
                                         _cross_origin(serving)])
        self.created = int(time.time())

    def _route(self, path: str, method: str, protocol: Protocol, handler, keyed: bool) -> Route:
        """The route's one boundary: the API key asked for (where keyed and the server has keys), and any
        failure answered in the protocol's error shape; a bug of ours is a 500 whose traceback goes to the
        operator."""
        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request, self._client(request) if keyed else None)
            except (ApiError, UnknownModel) as error:
                failure = error if isinstance(error, ApiError) else ApiError(404, str(error), param="model",
                                                                              code="model_not_found")
                self.log(f"{request.url.path} {failure.status} {failure.message}")
            except (UsageError, InputError) as error:  # the request's own fault, wherever it was found
                failure = api_error(error)
                self.log(f"{request.url.path} {failure.status} {failure.message}")
            except ClientDisconnect:  # (no one is left to answer)
                self.log(f"{request.url.path}: the client went away before its request had arrived")
                return Response(status_code=400)
            except Exception as error:
                self.log(traceback.format_exc().rstrip())
                failure = ApiError(500, f"internal error: {error}", "server_error")
            return JSONResponse(protocol.error_body(failure), status_code=failure.status, headers=failure.headers)

        return Route(path, endpoint, methods=[method])

    async def root(self, request: Request, client: str | None) -> Response:
        """The web page, for a browser; what Ollama's clients look for, for the rest."""
        if "text/html" in request.headers.get("accept", ""):
            if not self.serving.web_page:
                raise ApiError(404, "the web page is off (--no-webui)")
            return HTMLResponse(_page())
        return PlainTextResponse("localspec is running")

    async def health(self, request: Request, client: str | None) -> Response:
        stopped = self._stopped()
        if stopped:
            return JSONResponse({"status": "error", "error": stopped}, status_code=503)
        running = self._running()
        return JSONResponse({"status": "ok", "running": running > 0, "waiting": self.pool.pending - running})

    def _stopped(self) -> str | None:
        """Why a model's generation worker stopped, if one did."""
        return next((served.service.stopped for served in self.pool.loaded.values() if served.service.stopped), None)

    def _running(self) -> int:
        return sum(served.service.running for served in self.pool.loaded.values())

    async def models(self, request: Request, client: str | None) -> Response:
        loaded = {served.name: served for served in self.pool.loaded.values()}
        return JSONResponse(openai.model_list([(a.name, loaded[a.name].session if a.name in loaded else None)
                                               for a in self.pool.available()], self.created))

    async def model(self, request: Request, client: str | None) -> Response:
        available = self.pool.find(request.path_params["name"])  # (a 404 where it is not here)
        served = self.pool.loaded.get(available.key)
        return JSONResponse(openai.model_object(available.name, served and served.session, self.created))

    async def metrics(self, request: Request, client: str | None) -> Response:
        running = self._running()
        return PlainTextResponse(
            self.pool.metrics.prometheus(running=running, waiting=self.pool.pending - running,
                                         remembered=self.pool.remembered(), loaded=len(self.pool.loaded)),
            media_type="text/plain; version=0.0.4")

    async def embeddings(self, request: Request, client: str | None) -> Response:
        body = await self._body(request)
        served = await self._model(body.get("model"))
        asked, inputs = openai.parse_embeddings(body, served.session.target_model.n_embd)
        job = await self._done(Embedding(inputs, client, norm=asked.embd_normalize,
                                         dimensions=asked.dimensions), client, served, request, "input")
        return JSONResponse(openai.embedding_list(job.embeddings, job.embedded_tokens, served.name,
                                                  asked.encoding_format))

    async def llama_embeddings(self, request: Request, client: str | None) -> Response:
        """llama-server's own /embedding (and /embeddings): `content`, each vector in a list of its own."""
        body = await self._body(request)
        inputs, norm = llama_server.parse_embedding(body)
        served = await self._model(body.get("model"))
        job = await self._done(Embedding(inputs, client, norm=norm), client, served, request, "content")
        return JSONResponse(llama_server.embedded(job.embeddings))

    async def rerank(self, request: Request, client: str | None) -> Response:
        """llama-server's reranking (Jina's, Cohere's and TEI's request shapes): documents scored against a query by
        a reranker, highest first."""
        body = await self._body(request)
        asked, documents = llama_server.parse_rerank(body)
        served = await self._model(body.get("model"))
        job = await self._done(Embedding(documents, client, asked.query, asked.max_tokens_per_doc), client, served,
                               request, "documents")
        return JSONResponse(llama_server.reranked(asked, documents, job.embeddings, job.embedded_tokens, served.name))

    async def ollama_embed(self, request: Request, client: str | None) -> Response:
        started = time.perf_counter_ns()
        body = await self._body(request)
        served = await self._model(body.get("model"), ollama.keep_alive(body.get("keep_alive")), known_only=True)
        loaded = time.perf_counter_ns()
        self._context_asked(body, served)
        inputs, truncate, dimensions = ollama.parse_embed(body, served.session.target_model.n_embd)
        job = await self._done(Embedding(inputs, client, dimensions=dimensions, truncate=truncate), client, served,
                               request, "input")
        return JSONResponse(ollama.embedded(body.get("model") or served.name, job.embeddings, job.embedded_tokens,
                                            time.perf_counter_ns() - started, loaded - started))

    async def ollama_embeddings(self, request: Request, client: str | None) -> Response:
        body = await self._body(request)
        served = await self._model(body.get("model"), ollama.keep_alive(body.get("keep_alive")), known_only=True)
        job = await self._done(Embedding(ollama.parse_embeddings(body), client), client, served, request, "input")
        return JSONResponse({"embedding": job.embeddings[0]})

    async def _model(self, name, keep_alive: float | None = None, known_only: bool = False) -> Served:
        """The loaded model a request names (its `model`; keep_alive: Ollama's, in seconds), loaded now
        if it is not; UnknownModel if it is not here. A name that is no model at all is answered by the
        model serve started with, as llama-server does (clients send fixed names), unless known_only
        (Ollama's clients pull what is not there on a 404)."""
        try:
            try:
                return await self.pool.get(_named(name), keep_alive)
            except NotKnown:
                if known_only:
                    raise
                self.log(f"no model is called {name!r}: {self.pool.first.name} answers")
                return await self.pool.get(None, keep_alive)
        except UnknownModel:
            raise  # a 404, said at the route's one boundary
        except NoRoom as error:
            raise ApiError(503, str(error), "server_error", code="insufficient_memory") from None
        except LocalspecError as error:  # its file is there but does not load
            raise ApiError(500, f"the model {name!r} does not load: {error}", "server_error") from None

    async def _done(self, work: Embedding | SlotAction, client: str | None, served: Served,
                    request: Request | WebSocket, param: str | None = None) -> Job:
        """The finished job that did the work (an embedding, a slot action), run on the worker in its turn
        (cancelled if its client leaves: a socket's handler cancels it as it ends); ApiError if it failed
        (naming param)."""
        loop = asyncio.get_running_loop()
        ended: asyncio.Future = loop.create_future()

        def deliver(item) -> None:  # on the worker thread: the first error, or the end
            if item is FINISHED or isinstance(item, LocalspecError):
                loop.call_soon_threadsafe(lambda: ended.done() or ended.set_result(item))

        try:
            job = served.service.submit(work, deliver, _who(request, client))
        except LocalspecError as error:
            raise api_error(error) from None
        watcher = asyncio.create_task(_cancel_when_gone(request, [job])) if isinstance(request, Request) else None
        try:
            outcome = await ended
        finally:
            if watcher is not None:
                watcher.cancel()
            job.cancel()  # a no-op once it has finished
        if isinstance(outcome, LocalspecError):
            raise api_error(outcome, param)
        if job.outcome != "ok":
            raise ApiError(503, "the request was cancelled: the server is shutting down", "server_error",
                           code="cancelled")
        return job

    async def ollama_version(self, request: Request, client: str | None) -> Response:
        return JSONResponse(ollama.version())

    async def ollama_tags(self, request: Request, client: str | None) -> Response:
        return JSONResponse(ollama.tags([(a.name, self.pool.header(a.path)) for a in self.pool.available()]))

    async def ollama_ps(self, request: Request, client: str | None) -> Response:
        return JSONResponse(ollama.running([(s.name, s.session.target_info, s.expires_at, s.session.plan.target.on_gpu)
                                            for s in self.pool.loaded.values()]))

    async def ollama_show(self, request: Request, client: str | None) -> Response:
        body = await self._body(request)
        name = _named(body.get("model") or body.get("name"))
        found = self.pool.find(name)
        info, loaded = self.pool.header(found.path), self.pool.loaded.get(found.key)
        # (a loaded model's: serve's --chat-template stands for the first one's own)
        template = loaded.session.prompts.template if loaded else info.chat_template
        return JSONResponse(ollama.show(info, template, store.made(name),
                                        vision=loaded is not None and loaded.session.info.vision))

    async def ollama_pull(self, request: Request, client: str | None) -> Response:
        """Download a model into the models directory (as `localspec pull`), on a thread of its own so that
        generations go on; streamed as Ollama's statuses. Requests may name it once it is there."""
        self._may_change_models("pulls")
        asked = ollama.parse_pull(await self._body(request))
        try:
            wanted = store.find(asked.model)
        except LocalspecError as error:
            raise ApiError(404, str(error)) from None
        if isinstance(wanted, Path):  # (a pull of one answered success: it probed the file)
            raise ApiError(400, f"{asked.model!r} is a file name: pull takes a registry name,"
                           " hf:owner/repo/file.gguf or owner/repo:QUANT", param="model")
        self._unless_offline(asked.model, wanted)
        loop = asyncio.get_running_loop()
        statuses: asyncio.Queue = asyncio.Queue()

        def post(status: dict) -> None:  # on the download's thread
            if self.closing:  # what has arrived is kept: the next pull goes on from there
                raise FetchError("serve is shutting down: the pull stops here (pull again to go on)")
            loop.call_soon_threadsafe(statuses.put_nowait, status)

        def fetch() -> None:
            post({"status": "pulling manifest"})
            store.fetch(wanted, self.serving.offline, functools.partial(ollama.Progress, post), verify_sha256=True)
            post({"status": "verifying sha256 digest"})

        fetching = loop.run_in_executor(self._pulls, fetch)
        if not asked.stream:
            try:
                await fetching
            except LocalspecError as error:
                raise ApiError(500, str(error)) from None
            return JSONResponse({"status": "success"})
        return StreamingResponse(_pulled(fetching, statuses, self.log), media_type="application/x-ndjson")

    def _unless_offline(self, name: str, wanted: store.Resolved) -> None:
        """Under --offline, a request's pull of a model that is not here refused: serve contacts no Hub for it."""
        if not self.serving.offline:
            return
        try:
            store.fetch(wanted, offline=True)
        except FetchError:
            raise ApiError(403, f"serve runs --offline: it does not contact the Hub, and {name} is not downloaded"
                           f" (`localspec pull {name}` fetches it, or serve without --offline)", param="model",
                           code="offline") from None

    def _may_change_models(self, what: str) -> None:
        if not self.serving.model_changes:
            raise ApiError(403, f"{what} are off on this server: serve refuses Ollama's /api/pull, /api/create,"
                           " /api/copy, /api/delete and /api/blobs and LM Studio's /api/v1/models/download once --host"
                           " exposes it, unless started with --allow-pull", code="model_changes_disabled")

    async def ollama_create(self, request: Request, client: str | None) -> Response:
        """Make a model of one's own, as `localspec create` does (a made model's name then answers on every
        route); streamed as Ollama's statuses, what was read and left alone among them."""
        self._may_change_models("creates")
        asked = ollama.parse_create(await self._body(request))
        if asked.files and asked.preset.base:
            raise ApiError(400, "from and files: a model is made from one of them", param="files")

        def make() -> store.Preset:
            base, projector = store.blob_model(asked.files) if asked.files else (self._stored_name(asked.preset.base),
                                                                                  None)
            adapters = asked.preset.adapters + store.blob_adapters(asked.adapters)
            return store.make(replace(asked.preset, base=str(base), adapters=adapters,
                                      projector=str(projector) if projector else None))

        made = await asyncio.to_thread(make)
        self.log(f"created {made.name} from {made.base}" + "".join(f"; {note}" for note in asked.notes))
        if not asked.stream:
            return JSONResponse({"status": "success"})
        return StreamingResponse((json.dumps(status) + "\n" for status in ollama.created(made.name, asked.notes)),
                                 media_type="application/x-ndjson")

    async def ollama_blob_upload(self, request: Request, client: str | None) -> Response:
        """Keep a file uploaded as Ollama's clients upload a GGUF before /api/create names it in files (its bytes
        checked against the digest it is sent under); 201 once kept."""
        self._may_change_models("uploads")
        length = request.headers.get("content-length", "")
        upload = store.receive_blob(request.path_params["digest"], int(length) if length.isdigit() else None)
        # A large file may take long to arrive, but not stop arriving: one that sends nothing for --timeout
        # held its connection and its partial file until the client closed it.
        wait = self.serving.timeout
        try:
            async with asyncio.timeout(wait) as deadline:
                async for piece in request.stream():
                    upload.write(piece)
                    deadline.reschedule(asyncio.get_running_loop().time() + wait)
            kept = upload.finish()
        except TimeoutError:
            upload.abort()
            raise ApiError(408, f"the upload stopped: nothing arrived for {wait:g} s (--timeout) after"
                           f" {upload.received:,} bytes; nothing was kept", code="request_timeout",
                           headers={"Connection": "close"}) from None
        except BaseException:
            upload.abort()
            raise
        self.log(f"kept an upload of {upload.received:,} bytes as {kept.name}")
        return Response(status_code=201)

    async def ollama_blob_there(self, request: Request, client: str | None) -> Response:
        """Whether a file of this digest was uploaded (200) or not (404), as Ollama's clients ask before uploading."""
        return Response(status_code=200 if store.blob(request.path_params["digest"]) else 404)

    async def ollama_copy(self, request: Request, client: str | None) -> Response:
        """The model under another name, as `localspec cp` makes it."""
        self._may_change_models("copies")
        source, destination = ollama.parse_copy(await self._body(request))
        if store.made(source) is None:
            self.pool.find(source)  # (a name no model here has: a 404 saying so)
        made = await asyncio.to_thread(lambda: store.copy(self._stored_name(source), destination))
        self.log(f"copied {source} to {made.name}")
        return Response(status_code=200)

    def _stored_name(self, name: str) -> str:
        """A model's name as the store knows it: a name only serve answers to (its --alias) is the file it serves."""
        try:
            store.find(name)
        except UsageError:
            with contextlib.suppress(UnknownModel):
                return str(self.pool.find(name).path)
        return name

    async def ollama_delete(self, request: Request, client: str | None) -> Response:
        """Remove a model made with create or cp, or delete a downloaded registry model's file where no model
        loaded here reads it."""
        self._may_change_models("deletes")
        name = ollama.parse_delete(await self._body(request))
        try:
            forgotten = store.forget(name)
        except UsageError as error:
            raise ApiError(400, str(error), param="model") from None
        if forgotten:
            self.log(f"removed {name}")
            return Response(status_code=200)
        wanted = self.pool.find(name)
        if self.pool.holds(wanted.path):
            raise ApiError(409, f"{wanted.name} is loaded: unload it first (keep_alive 0, or `localspec stop"
                           f" {wanted.name}`); the model serve started with stays while serve runs", param="model")
        if wanted.entry is None:
            raise ApiError(400, f"{name} is a file, not a downloaded model: files are yours to delete", param="model")
        freed = await asyncio.to_thread(store.remove, wanted.entry)
        self.log(f"deleted {wanted.name} ({freed} bytes)")
        return Response(status_code=200)

    async def ollama_generate(self, request: Request, client: str | None, chat: bool) -> Response:
        body = await self._body(request)
        keep_alive = ollama.keep_alive(body.get("keep_alive"))
        if keep_alive == 0 and not body.get("prompt") and not body.get("messages"):  # Ollama's "unload it"
            answer = ollama.Answer(chat, body.get("model") or self.pool.first.name)
            goes = await self.pool.unload_when_idle(_named(body.get("model")))
            return JSONResponse(answer.unloaded() if goes else answer.loaded())
        asked = time.perf_counter_ns()
        served = await self._model(body.get("model"), keep_alive, known_only=True)
        loaded = time.perf_counter_ns()
        self._context_asked(body, served)
        model = body.get("model") or served.name
        parsed = await self._parse(body, chat, OLLAMA, served)
        if parsed is None:  # an empty prompt: clients send one to load the model
            return JSONResponse(ollama.Answer(chat, model).loaded())
        answer = OLLAMA.answering(chat, model, parsed)
        answer.waited_for_model(asked, loaded)
        return await self._respond(request, client, parsed, answer, served)

    async def openai_generate(self, request: Request, client: str | None, chat: bool, stats: bool = False
                              ) -> Response:
        """OpenAI's chat and completions (stats: LM Studio's /api/v0, a whole answer with its stats beside it)."""
        body = await self._body(request)
        extras = lmstudio.extras(body)  # (read before the model loads, as a bad ttl is refused)
        served = await self._model(body.get("model"), extras.ttl)
        parsed = await self._parse(body, chat, OPENAI, served)
        self._draft_asked(extras, served)
        answered_as = _answered_as(parsed, served)
        return await self._respond(request, client, parsed, lmstudio.Reply(chat, answered_as, parsed, served.session)
                                   if stats else OPENAI.answering(chat, answered_as, parsed), served)

    def _draft_asked(self, extras: lmstudio.Extras, served: Served) -> None:
        """LM Studio's `draft_model`: the model drafts with the draft serve loaded beside it (the answer is the
        target's own whichever drafts); one that names another is said in the log, once a name."""
        drafts = served.session.info.draft
        if extras.draft is not None and extras.draft != drafts:
            self._say_once(("draft_model", served.name, extras.draft), f"draft_model {extras.draft_asked[:200]!r}"
                           f" asked: {served.name} drafts with {drafts or 'no draft model'} (serve's --draft chooses it;"
                           " the answer is the same either way)")

    def _context_asked(self, body: dict, served: Served) -> None:
        """Ollama's options.num_ctx (Continue sends its context length with every request): the context is the one
        serve loaded the model with; a larger one asked for is said in the log, once a size."""
        options = body.get("options")
        asked = options.get("num_ctx") if isinstance(options, dict) else None
        n_ctx = served.session.info.n_ctx
        if isinstance(asked, int) and not isinstance(asked, bool) and asked > n_ctx:
            self._say_once(("num_ctx", served.name, asked), f"options.num_ctx {asked} asked: {served.name} is loaded"
                           f" with a context of {n_ctx} tokens (serve's -c sets it); a longer prompt is refused, or"
                           " loses its oldest turns where truncate says so")

    def _say_once(self, key: tuple, line: str) -> None:
        """A line for the log, said the first time its key comes (clients send the same with every request); the
        newest MOST_KEPT keys remembered (a client's names are its own: endless distinct ones grew the set)."""
        if key not in self._said:
            self._said[key] = None
            while len(self._said) > MOST_KEPT:
                self._said.pop(next(iter(self._said)))
            self.log(line)

    async def lmstudio_v1_models(self, request: Request, client: str | None) -> Response:
        models = []
        for available in self.pool.available():
            served = self.pool.loaded.get(available.key)
            models.append(lmstudio.v1_model_entry(available.name, self.pool.header(available.path), available.entry,
                                                  served and served.session))
        return JSONResponse({"models": models})

    async def lmstudio_chat(self, request: Request, client: str | None) -> Response:
        """LM Studio's v1 chat: its input and stats; streamed as its named events."""
        body = await self._body(request)
        asked, loaded_before = time.perf_counter(), set(map(id, self.pool.loaded.values()))
        served = await self._model(body.get("model"), lmstudio.ttl(body))  # (a name no model has: serve's, as on /v1)
        load_seconds = time.perf_counter() - asked if id(served) not in loaded_before else None
        wanted = body.get("context_length")
        if isinstance(wanted, int) and wanted > served.session.info.n_ctx:
            raise ApiError(400, f"{served.name} is loaded with a context of {served.session.info.n_ctx} tokens, not"
                           f" {wanted}: serve's -c sets it", param="context_length")
        parsed = await self._parse(body, True, self.lmstudio, served)
        answer = self.lmstudio.answering(True, served.name, parsed)
        answer.load_seconds = load_seconds
        return await self._respond(request, client, parsed, answer, served)

    async def lmstudio_load(self, request: Request, client: str | None) -> Response:
        asked = lmstudio.parse_load(await self._body(request))
        started = time.perf_counter()
        served = await self._model(asked.model, known_only=True)
        ignored = [name for name in ("flash_attention", "num_experts", "offload_kv_cache_to_gpu")
                   if getattr(asked, name) is not None]
        if ignored:
            self.log(f"loading {served.name}: {', '.join(ignored)} left to serve's command line")
        return JSONResponse(lmstudio.loaded(asked, served.name, served.session, self.pool.runtime.prompt_batch,
                                            time.perf_counter() - started))

    async def lmstudio_unload(self, request: Request, client: str | None) -> Response:
        instance = (await self._body(request)).get("instance_id")
        if not isinstance(instance, str) or not instance:
            raise ApiError(400, "instance_id names the loaded model to unload", param="instance_id")
        wanted = self.pool.find(instance)
        if wanted.key not in self.pool.loaded:
            raise ApiError(404, f"no instance {instance!r} is loaded", param="instance_id", code="model_not_found")
        if not await self.pool.unload_when_idle(instance):
            raise ApiError(400, f"{instance} is the model serve started with: it stays loaded while serve runs",
                           param="instance_id")
        return JSONResponse({"instance_id": instance})

    async def lmstudio_download(self, request: Request, client: str | None) -> Response:
        """LM Studio's download: a model (a registry name, hf:owner/repo/file.gguf, or owner/repo with its
        quantization) fetched as `localspec pull` fetches it, on a thread of its own, its job's status asked for
        by id."""
        self._may_change_models("downloads")
        body = await self._body(request)
        model, quantization = body.get("model"), body.get("quantization")
        if not isinstance(model, str) or not model:
            raise ApiError(400, "model names the model to download", param="model")
        if quantization is not None and not isinstance(quantization, str):
            raise ApiError(400, "quantization names the file of a Hub repository's to download (Q4_K_M, ...)",
                           param="quantization")
        try:
            wanted = store.find(f"{model.removeprefix('https://huggingface.co/')}:{quantization}" if quantization
                                else model)
        except LocalspecError as error:
            raise ApiError(404, str(error), param="model", code="model_not_found") from None
        if isinstance(wanted, Path):
            raise ApiError(400, f"{model!r} is a file on this machine: nothing to download", param="model")
        self._unless_offline(model, wanted)
        if isinstance(wanted, store.ModelEntry) and store.installed(wanted) is not None:
            return JSONResponse({"status": "already_downloaded"})
        return JSONResponse(self.download(model, wanted).started_body())

    def download(self, name: str, wanted: store.Resolved, stopped: Callable[[], str] = lambda: ""
                 ) -> lmstudio.Download:
        """A download begun on a thread of its own, as `localspec pull` fetches it: its job, which says how it goes
        (kept to be asked for by id). It stops where serve shuts down, or where stopped() says why."""
        job = lmstudio.Download(getattr(wanted, "size", None),
                                lambda: "serve is shutting down" if self.closing else stopped())
        self._downloads[job.job_id] = job
        while len(self._downloads) > MOST_KEPT:
            self._downloads.pop(next(iter(self._downloads)))

        def fetch() -> None:
            try:
                store.fetch(wanted, self.serving.offline, job.bar, verify_sha256=True)
            except LocalspecError as error:
                job.end(error)
                self.log(f"download {job.job_id} of {name} failed: {error}")
            else:
                job.end(None)
                self.log(f"downloaded {name} ({job.job_id})")

        job.fetching = asyncio.get_running_loop().run_in_executor(self._pulls, fetch)
        return job

    async def lmstudio_download_status(self, request: Request, client: str | None) -> Response:
        job = self._downloads.get(request.path_params["job_id"])
        if job is None:
            raise ApiError(404, f"no download job {request.path_params['job_id']!r} is known here (serve keeps its"
                           f" newest {MOST_KEPT:,} while it runs)", code="job_not_found")
        return JSONResponse(job.status_body())

    async def sdk_socket(self, namespace: str, websocket: WebSocket) -> None:
        await SdkSocket(self, namespace, _Socket(websocket)).run()

    async def lmstudio_greeting(self, request: Request, client: str | None) -> Response:
        return JSONResponse(lmstudio_sdk.GREETING)

    async def lmstudio_models(self, request: Request, client: str | None) -> Response:
        return JSONResponse({"object": "list", "data": [self._lmstudio_model(a) for a in self.pool.available()]})

    async def lmstudio_model(self, request: Request, client: str | None) -> Response:
        return JSONResponse(self._lmstudio_model(self.pool.find(request.path_params["name"])))

    def _lmstudio_model(self, available: store.Local) -> dict:
        served = self.pool.loaded.get(available.key)
        return lmstudio.model_object(available.name, self.pool.header(available.path), available.entry,
                                     served and served.session, self.pool.loading(available))

    async def transcriptions(self, request: Request, client: str | None) -> Response:
        """OpenAI's speech to text (its client's audio.transcriptions), as llama-server answers it: the audio file
        asked of the model as a chat, "Transcribe audio to text"."""
        fields, audio = _form(await self._bytes(request), request.headers.get("content-type", ""))
        served = await self._model(fields.get("model"))
        if not served.session.info.audio:
            raise ApiError(400, f"the model {served.name!r} reads no audio: serve it with a projector that hears"
                           " (--mmproj)", param="file")
        body = openai.transcription_chat(fields, audio, served.session.prompts.template)
        parsed = await self._parse(body, True, OPENAI, served)
        return await self._respond(request, client, parsed, openai.Transcript(True, served.name), served)

    async def responses_create(self, request: Request, client: str | None) -> Response:
        body = await self._body(request)
        served = await self._model(body.get("model"))
        parsed = await self._parse(body, True, self.responses, served)
        return await self._respond(request, client, parsed,
                                   self.responses.answering(True, _answered_as(parsed, served), parsed), served)

    async def anthropic_messages(self, request: Request, client: str | None) -> Response:
        body = await self._body(request)
        served = await self._model(body.get("model"))
        parsed = await self._parse(body, True, ANTHROPIC, served)
        return await self._respond(request, client, parsed, ANTHROPIC.answering(True, body.get("model") or served.name,
                                                                                 parsed), served)

    async def llama_completion(self, request: Request, client: str | None) -> Response:
        """llama-server's own completion (not OpenAI's): its fields, answers and events."""
        body = await self._body(request)
        served = await self._model(body.get("model"))
        if isinstance(body.get("prompt"), dict):  # (prompt_string with multimodal_data: images where it says)
            body = body | {"prompt": await asyncio.to_thread(llama_server.multimodal_prompt, served.session,
                                                             body["prompt"])}
        parsed = await self._parse(body, False, LLAMA_SERVER, served)
        return await self._respond(request, client, parsed, LLAMA_SERVER.answering(False, served.name, parsed),
                                   served)

    async def llama_infill(self, request: Request, client: str | None) -> Response:
        """llama-server's code infill: what goes between the code before the cursor and after it, asked of the
        model with its fill-in-the-middle tokens as llama-server lays them out (Prompts.infill)."""
        body = await self._body(request)
        served = await self._model(body.get("model"))

        def parse() -> Parsed:
            defaults = _as_made(self.defaults, _made_of(body))
            asked = llama_server.validated_body(llama_server.InfillBody, body)
            files = [(chunk.filename, chunk.text) for chunk in asked.input_extra]
            try:
                prompt = served.session.prompts.infill(asked.input_prefix, asked.input_suffix, files, asked.prompt,
                                                       defaults.limits.max_tokens)
            except LocalspecError as error:
                raise api_error(error, "input_prefix") from None
            return llama_server.parse_completion(asked, defaults, prompt)

        parsed = await asyncio.to_thread(parse)
        return await self._respond(request, client, parsed, LLAMA_SERVER.answering(False, served.name, parsed),
                                   served)

    async def llama_tokenize(self, request: Request, client: str | None) -> Response:
        body = await self._body(request)
        served = await self._model(body.get("model"))
        return JSONResponse(await asyncio.to_thread(llama_server.tokenized, served.session, body))

    async def llama_detokenize(self, request: Request, client: str | None) -> Response:
        body = await self._body(request)
        served = await self._model(body.get("model"))
        return JSONResponse(await asyncio.to_thread(llama_server.detokenized, served.session, body))

    async def llama_apply_template(self, request: Request, client: str | None) -> Response:
        """llama-server's: the prompt a chat request's messages (with its tools and thinking) are read as, as text,
        for a client to change and send to /completion, which adds the start token back."""
        body = await self._body(request)
        served = await self._model(body.get("model"))
        parsed = await self._parse(body, True, OPENAI, served)  # (a made model's system prompt and all)

        return JSONResponse({"prompt": await asyncio.to_thread(rendered, served.session, parsed.request)})

    async def llama_props(self, request: Request, client: str | None) -> Response:
        """What llama-server says of itself (its default settings, context and slots), for the model asked."""
        served = await self._model(request.query_params.get("model"))
        return JSONResponse(llama_server.props(served.session, self.defaults, len(served.session.sequences)))

    async def llama_slots(self, request: Request, client: str | None) -> Response:
        """llama-server's GET /slots: each sequence, and what it generates now (a 503 with fail_on_no_slot where
        none is free)."""
        if not self.serving.slots:
            raise ApiError(501, "This server does not support slots endpoint. Start it with `--slots`")
        served = await self._model(request.query_params.get("model"))
        running = {sequence: (job.request, len(job.recorder.ids))
                   for sequence, job in served.service.running_now().items()}
        if request.query_params.get("fail_on_no_slot") and len(running) >= len(served.session.sequences):
            raise ApiError(503, "no slot available")
        return JSONResponse(llama_server.slots(served.session, self.defaults, running))

    async def llama_slot_action(self, request: Request, client: str | None) -> Response:
        """llama-server's POST /slots/ID?action=save|restore|erase: a sequence's cache to a file of the
        --slot-save-path folder and back, or emptied, once no request generates on it."""
        folder = self.serving.slot_save_path
        if folder is None:
            raise ApiError(501, "This server does not support slots action. Start it with `--slot-save-path`")
        served = await self._model(request.query_params.get("model"))
        sequence = request.path_params["id_slot"]
        if not sequence.isdigit() or int(sequence) >= len(served.session.sequences):
            raise ApiError(400, "Invalid slot ID")
        action = request.query_params.get("action")
        if action not in ("save", "restore", "erase"):
            raise ApiError(400, "Invalid action", param="action")
        path = None if action == "erase" else llama_server.slot_file(folder, await self._body(request))
        if action == "restore" and not path.is_file():
            raise ApiError(400, f"Unable to restore slot: no file {path.name} in {folder}", param="filename")
        job = await self._done(SlotAction(int(sequence), action, path, client), client, served, request)
        return JSONResponse(llama_server.slot_acted(action, int(sequence), path and path.name, *job.acted,
                                                    job.seconds))

    async def lora_adapters(self, request: Request, client: str | None) -> Response:
        """llama-server's GET /lora-adapters: the LoRA adapters loaded (--lora), by id, with the scale each
        request that names none computes with."""
        served = await self._model(request.query_params.get("model"))
        return JSONResponse(llama_server.lora_adapters(served.session))

    async def set_lora_adapters(self, request: Request, client: str | None) -> Response:
        """llama-server's POST /lora-adapters: [{id, scale}, ...] the scales every request that names none
        computes with from now on (an adapter left out: 0); requests already running keep theirs."""
        served = await self._model(request.query_params.get("model"))
        served.session.adapters.scales = llama_server.lora_scales(await self._body(request, array=True),
                                                                  served.session)
        self.log(f"LoRA scales now {', '.join(f'{scale:g}' for scale in served.session.adapters.scales)}")
        return JSONResponse({"success": True})

    async def tokenizer_info(self, request: Request, client: str | None) -> Response:
        """vLLM's: the special tokens and chat template of the model asked for (lm-eval's remote tokenizer)."""
        served = await self._model(request.query_params.get("model"))
        return JSONResponse(llama_server.tokenizer_info(served.session))

    async def native_generate(self, request: Request, client: str | None) -> Response:
        """localspec's own stream, which `run` and `chat` read (remote.py)."""
        body = await self._body(request)
        served = await self._model(body.get("model"), known_only=True)
        parsed = await self._parse(body, True, NATIVE, served)
        return await self._respond(request, client, parsed, NATIVE.answering(True, served.name, parsed), served)

    async def native_info(self, request: Request, client: str | None) -> Response:
        served = await self._model(request.query_params.get("model"), known_only=True)
        return JSONResponse(native.info(served.session) | {"model": served.name})

    async def native_tokens(self, request: Request, client: str | None) -> Response:
        body = await self._body(request)
        served = await self._model(body.get("model"), known_only=True)
        asked = native.request_of(body)
        try:  # (tokenized on a thread, as a request's parsing is)
            return JSONResponse({"tokens": await asyncio.to_thread(served.session.count_tokens, asked)})
        except LocalspecError as error:
            raise api_error(error) from None

    async def anthropic_count_tokens(self, request: Request, client: str | None) -> Response:
        """The prompt a Messages request would be read as, counted: rendered with the chat template and the
        tools, tokenized (on a thread, as a request's parsing is)."""
        body = await self._body(request)
        served = await self._model(body.get("model"))

        def count() -> int:
            asked = self._with_template_variables(anthropic.parse_count(body, self.defaults))
            try:
                return len(served.session.prompts.prepare(asked).tokens)
            except LocalspecError as error:
                raise api_error(error) from None

        return JSONResponse({"input_tokens": await asyncio.to_thread(count)})

    async def input_tokens(self, request: Request, client: str | None, protocol: Protocol) -> Response:
        """OpenAI's count of a Responses request's input tokens (the openai package's
        `responses.input_tokens.count`), and llama-server's of a chat completion's: the prompt it would be
        read as, counted, as its answer's usage would count it."""
        body = await self._body(request)
        served = await self._model(body.get("model"))
        parsed = await self._parse(body, True, protocol, served)

        def count() -> int:
            try:
                return len(served.session.prompts.prepare(parsed.request).tokens)
            except LocalspecError as error:
                raise api_error(error) from None

        return JSONResponse({"object": "response.input_tokens", "input_tokens": await asyncio.to_thread(count)})

    async def _not_found(self, request: Request, error: HTTPException) -> Response:
        if error.status_code == 405:
            message = f"{request.url.path} takes {(error.headers or {}).get('Allow', 'another method')}, not {request.method}"
        else:
            routes = ", ".join(f"{method} {path}" for path, method, *_ in self.routes if path != "/")
            message = f"{request.method} {request.url.path} is not part of this API ({routes})"
        self.log(f"{request.url.path} {error.status_code} {message}")
        failure = ApiError(error.status_code, message, code="not_found" if error.status_code == 404
                           else "method_not_allowed", headers=error.headers)
        return JSONResponse(protocol_at(request.url.path, self.routes).error_body(failure), status_code=failure.status,
                            headers=failure.headers)

    def _client(self, request: Request) -> str | None:
        """Which API key the request carries (a digest of it, which names the same key however the keys are
        listed, after a restart too: prompts kept on disk are that key's alone; None when the server has no
        keys); ApiError 401 if it carries none of them."""
        keys = self.serving.api_keys
        if not keys:
            return None
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if "x-api-key" in request.headers:  # Anthropic's clients send their key so
            scheme, given = "bearer", request.headers["x-api-key"]
        if scheme.lower() == "bearer":
            # every key compared, in constant time each: how long a refusal takes tells nothing of the keys
            matches = [hmac.compare_digest(given.strip().encode(), key.encode()) for key in keys]
            if any(matches):
                return "key " + hashlib.sha256(keys[matches.index(True)].encode()).hexdigest()[:16]
        raise ApiError(401, "a valid API key is needed: send the header 'Authorization: Bearer KEY' or"
                       " 'x-api-key: KEY' (a key given to serve with --api-key or --api-key-file)", code="invalid_api_key",
                       headers={"WWW-Authenticate": "Bearer"})

    async def _parse(self, body: dict, chat: bool, protocol: Protocol, served: Served) -> Parsed | None:
        """The request as the protocol reads it (None: nothing to generate), on a thread: a JSON schema's
        conversion to a grammar took a second for 20,000 properties, and the event loop serves everyone.
        Refused here by arithmetic alone if it cannot fit the context: rendered and tokenized on the
        worker, 100,000 messages held every other request for minutes. The messages are counted before
        they are validated (validating 100,000 takes a second)."""
        return await asyncio.to_thread(self._parse_now, body, chat, protocol, served)

    def _parse_now(self, body: dict, chat: bool, protocol: Protocol, served: Served) -> Parsed | None:
        made = _made_of(body)
        try:
            if chat and isinstance(body.get("messages"), list):
                served.session.prompts.refuse_what_cannot_fit(0, len(body["messages"]))
            parsed = protocol.parse(body, chat, _as_made(self.defaults, made))
            if parsed is not None and made is not None:
                parsed = replace(parsed, made=made.name)
                asked = parsed.request
                if asked.messages is not None:
                    parsed = replace(parsed, request=replace(
                        asked, messages=made.conversation(asked.messages, continued=bool(asked.continues))))
            if parsed is not None:
                parsed = replace(parsed, request=self._with_template_variables(parsed.request))
            if parsed is not None and parsed.fits:
                parsed = self._fitted(parsed, served)
            if parsed is not None:
                served.session.prompts.refuse_what_cannot_fit(parsed.request.characters,
                                                              len(parsed.request.messages or ()))
        except ContextOverflow as error:
            raise api_error(error, "messages" if chat else "prompt") from None
        return parsed

    def _with_template_variables(self, asked: LibraryRequest) -> LibraryRequest:
        """A chat request with --chat-template-kwargs under its own variables, as llama-server merges them."""
        if asked.messages is None or not self.defaults.template_variables:
            return asked
        return replace(asked, template_variables=self.defaults.template_variables | (asked.template_variables or {}))

    def _fitted(self, parsed: Parsed, served: Served) -> Parsed:
        """The conversation without the oldest turns that leave no room for the answer (its max_tokens, at most a
        quarter of the context), as Ollama's truncate drops them before reading; said in the log."""
        asked, n_ctx = parsed.request, served.session.info.n_ctx
        room = min(asked.limits.max_tokens or n_ctx, n_ctx // 4)
        try:
            kept = without_oldest_turns(served.session, asked.messages, n_ctx - room, asked)
        except LocalspecError:  # (a prompt that cannot be made at all: refused by its generation, as any other)
            return parsed
        if kept is asked.messages:
            return parsed
        self.log(f"dropped the oldest {len(asked.messages) - len(kept)} of {len(asked.messages)} messages to leave"
                 f" {room} tokens of the context of {n_ctx} for the answer")
        return replace(parsed, request=replace(asked, messages=kept))

    async def _body(self, request: Request, array: bool = False) -> dict | list:
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        if encoding != "identity":  # (a gzip body was "not valid JSON: can't decode byte 0x8b")
            raise ApiError(415, f"a body sent with Content-Encoding {encoding} is not read here: send it uncompressed",
                           code="unsupported_encoding")
        data = await self._bytes(request)
        try:
            body = loads_json(data)
        except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError too
            raise ApiError(400, f"the request body is not valid JSON: {error}", code="invalid_json") from None
        if not isinstance(body, list if array else dict):
            raise ApiError(400, f"the request body must be a JSON {'array' if array else 'object'}",
                           code="invalid_json")
        return body

    async def _bytes(self, request: Request) -> bytearray:
        """The request's body, at most --max-body bytes (413) arriving within --timeout (408)."""
        limit = self.serving.max_body
        too_big = ApiError(413, f"the request body is larger than {limit:,} bytes", code="request_too_large")
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            raise too_big
        data = bytearray()
        try:
            # a body sent a byte at a time holds the door as slow headers do: the same timeout for all of it
            async with asyncio.timeout(self.serving.timeout):
                async for chunk in request.stream():
                    data += chunk
                    if len(data) > limit:
                        raise too_big
        except TimeoutError:
            raise ApiError(408, f"the request body did not arrive within {self.serving.timeout:g} s (--timeout)",
                           code="request_timeout", headers={"Connection": "close"}) from None
        return data

    async def _respond(self, request: Request, client: str | None, parsed: Parsed, answering: Answering,
                       served: Served) -> Response:
        """The answer in its protocol's shape (answering), whole or streamed. OpenAI's n asks for several
        answers to one prompt, each its own job with its own drafter: the first reads the prompt, and the
        others, started once it has, take its cells on sequences of their own (Session.sequence_for), so the
        prompt is read once; with one sequence they follow it, reusing it."""
        if parsed.renders_only:
            return JSONResponse(answering.rendered(await asyncio.to_thread(rendered, served.session, parsed.request)))
        parsed = replace(parsed, request=replace(parsed.request, client=client))
        jobs: list[Job] = []
        outbox: asyncio.Queue = asyncio.Queue()  # (choice, item) of every job
        watcher = asyncio.create_task(_cancel_when_gone(request, jobs))
        streaming = False
        try:
            asked_all = choices_of(parsed)
            first = await self._started(asked_all, parsed.stream, answering, served, _who(request, client), jobs,
                                        outbox)
            if parsed.stream:
                streaming = True
                stream = self._stream(jobs, answering, first, outbox, request.url.path, watcher)
                return StreamingResponse(stream, media_type=answering.media_type, headers=answering.headers)
            left = len(jobs)
            while left:
                index, item = await outbox.get()
                if isinstance(item, LocalspecError) or item is FINISHED and jobs[index].outcome != "ok":
                    raise self._failure(jobs[index], item, answering)
                left -= item is FINISHED
            for job in jobs:
                self._log_job(request.url.path, job)
            return JSONResponse(answering.full(jobs[0]) if len(jobs) == 1 else answering.choices(jobs))
        finally:
            if not streaming:  # else the stream ends the watcher and the jobs
                watcher.cancel()
                for job in jobs:
                    job.cancel()  # a no-op once it has finished; else its handler was cancelled (shutting down)

    async def _started(self, asked_all: list[LibraryRequest], stream: bool, answering: Answering, served: Served,
                       who: str | None, jobs: list[Job], outbox: asyncio.Queue) -> tuple:
        """The jobs of a request's choices (choices_of) submitted (into jobs, each handing its items to the outbox), and
        the first job's first item: its prompt read; ApiError where it failed before."""
        if len(asked_all) > served.service.most_held:  # (each choice takes a place: it was a 429 however long one waited)
            raise ApiError(400, f"{len(asked_all)} answers to one request are more than one client may have running"
                           f" and waiting here ({served.service.most_held}: serve's --queue and --parallel, a quarter"
                           " kept for others); ask for fewer, or start serve with a larger --queue")
        # (a long reading is streamed to keep the stream open where only one job reads: the others of several
        # start once the first has read, to take its cells)
        reading = answering.shows_reading or answering.keepalive is not None and len(asked_all) == 1
        for index, asked in enumerate(asked_all):
            try:
                jobs.append(served.service.submit(asked, _deliverer(outbox, stream, index,
                                                                    answering.every_event, reading), who))
            except LocalspecError as error:
                raise api_error(error) from None
            if index == 0:  # its prompt read (or it failed) before the others look for its cells
                first = await outbox.get()
                if first[1] is FINISHED or isinstance(first[1], LocalspecError):
                    raise self._failure(jobs[0], first[1], answering)
        return first

    def _failure(self, job: Job, item, answering: Answering) -> ApiError:
        if isinstance(item, LocalspecError):
            return api_error(item, answering.prompt_field)
        # cancelled without an error: the server is stopping, or its client left (and reads nothing)
        why = "the server is shutting down" if self.closing else "the client went away"
        return ApiError(503, f"the generation was cancelled after {job.recorder.tokens} tokens: {why}",
                        "server_error", code="cancelled")

    async def _stream(self, jobs: list[Job], reply: Answering, first, outbox: asyncio.Queue, path: str,
                      watcher: asyncio.Task | None) -> AsyncIterator[str]:
        """The answer as it is made, framed as the client's protocol streams (reply); several choices side by
        side, each framed as its own (reply.choice), its end as it ends, then what ends them all. An error
        after the first byte can only be said in the stream itself, as llama-server and Ollama do."""
        several = len(jobs) > 1
        framings = [_Framing(job, reply.choice(index) if several else reply) for index, job in enumerate(jobs)]
        job = jobs[0]
        try:
            left, (index, item) = len(jobs), first
            while True:
                job, framing = jobs[index], framings[index]
                if isinstance(item, LocalspecError) or item is FINISHED and job.outcome != "ok":
                    error = self._failure(job, item, reply)
                    self.log(f"{path} {error.status} (streamed{f', choice {index}' if several else ''})"
                             f" {error.message}")
                    yield reply.error(error)
                    return
                if item is FINISHED:
                    ending = framing.ending()  # (the calls the reader still held counted before the close says any)
                    called = framing.calls > 0
                    ending += framing.frames.finish(job, called) if several else reply.closing(job, called)
                    for frame in ending:
                        yield frame
                    left -= 1
                else:
                    for frame in framing.of(item):
                        yield frame
                if not left:
                    break
                index, item = await outbox.get()
            for frame in reply.ended(jobs) if several else ():
                yield frame
            for job in jobs:
                self._log_job(path, job)
        except InputError as error:  # an answer's tool calls could not be read
            failure = tool_call_error(job, error)
            self.log(f"{path} {failure.status} (streamed) {failure.message}")
            yield reply.error(failure)
        except asyncio.CancelledError:
            self.log(f"{path} (streamed) cancelled after {sum(j.recorder.tokens for j in jobs)} tokens: the client"
                     " went away")
            raise
        except Exception as error:  # a bug of ours, after the first byte: said in the stream
            self.log(traceback.format_exc().rstrip())
            yield reply.error(ApiError(500, f"internal error: {error}", "server_error"))
        finally:
            if watcher is not None:
                watcher.cancel()
            for job in jobs:
                job.cancel()  # the client left mid-stream (or it ended, and this is a no-op)

    def _log_job(self, path: str, job: Job) -> None:
        s = job.recorder.summary()
        drafted = (f", {s.accepted}/{s.drafted} draft tokens accepted ({', '.join(map(str, s.drafters))})"
                   if s.drafted else ", no drafts")
        self.log(f"{path} 200 {s.tokens} tokens in {s.decode_seconds:.2f} s ({s.tokens_per_second:.1f} tok/s,"
                 f" {s.mean_accepted_length:.2f} tokens/step{drafted}); prompt {s.prompt_tokens} tokens,"
                 f" {s.reused_prompt_tokens} from cache")

    def run(self, listener: socket.socket) -> None:
        """Serve on the listening socket until Ctrl-C or SIGTERM, which cancel the running generation
        at its next step."""
        # made ready before "serving" is printed: what a client meets is in place once it is said
        self.pool.first.session.warm()  # what the first request would wait for is read now, not on the event loop
        keeper = _Doorkeeper(self._connection_limit(), self.serving.timeout, self.log)
        config = uvicorn.Config(self.app, log_config=None, log_level="critical", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=SHUTDOWN_GRACE_SECONDS,
                                timeout_keep_alive=self.serving.timeout, http=functools.partial(_Door, keeper=keeper),
                                **({"ssl_certfile": str(self.serving.certificate),
                                    "ssl_keyfile": str(self.serving.private_key)} if self.serving.tls else {}))
        server = _Uvicorn(config, on_ready=functools.partial(self._ready, listener), on_exit=self._stop)
        try:
            asyncio.run(self._serve(server, listener))
        finally:
            stopped = self._stopped()  # (read before the pool unloads the models)
            self._pulls.shutdown(wait=False, cancel_futures=True)  # (those running stop at their next status)
            self.pool.close()
        if stopped:  # a supervisor (systemd, a container's restart policy) starts serve again
            raise EngineError(f"{stopped}; serve stopped (start it again)")

    def _ready(self, listener: socket.socket) -> None:
        print(f"localspec: serving {self.pool.first.name} on {net.url(*listener.getsockname()[:2], self.serving.tls)}"
              " (OpenAI's API; Ollama's at"
              " /api; Ctrl-C stops)", flush=True)
        if self.serving.exposure_warning:
            self.log(self.serving.exposure_warning)

    def _stop(self) -> None:
        self.closing = True
        self.pool.cancel_all()

    async def _serve(self, server: "_Uvicorn", listener: socket.socket) -> None:
        reaper = asyncio.create_task(self._reap())
        watchdog = asyncio.create_task(self._watch(server))
        try:
            await server.serve(sockets=[listener])
        finally:
            reaper.cancel()
            watchdog.cancel()

    async def _watch(self, server: "_Uvicorn") -> None:
        """Shut down once a generation worker has stopped: its requests were answered 503 in one line, and
        a server that can no longer generate should be restarted, not left running."""
        while not self._stopped():
            await asyncio.sleep(WATCH_SECONDS)
        self.log(f"localspec: {self._stopped()}; serve is shutting down")
        server.should_exit = True

    async def _reap(self) -> None:
        """Unload, now and then, the models idle beyond their keep-alive."""
        while True:
            await asyncio.sleep(REAP_SECONDS)
            try:
                await self.pool.reap()
            except Exception:  # a bug of ours: said, and the next round tries again
                self.log(traceback.format_exc().rstrip())

    def _connection_limit(self) -> int:
        """--max-connections, lowered to what the open-file limit leaves room for (raised first where
        allowed: a process out of files cannot even accept the connection that would answer /health)."""
        files = net.raise_open_file_limit()
        wanted = self.serving.max_connections
        if files is None or files - FILES_FOR_OTHER_USES >= wanted:
            return wanted
        limit = max(1, files - FILES_FOR_OTHER_USES)
        self.log(f"at most {limit} connections at once, not {wanted}: this process may open {files} files"
                 " (raise the hard limit with ulimit -Hn)")
        return limit


# Pages served from this machine, on any port: a web UI beside the server (Ollama lets them in too)
LOCAL_ORIGINS = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?"


@functools.cache
def _page() -> str:
    """serve's web page, read once."""
    return resources.files("localspec").joinpath("web/index.html").read_text(encoding="utf-8")


LOADING_BODY_LIMIT = 8 * 2**20  # bytes of a request's body read (and dropped) before it is answered 503
LOADING_READ_SECONDS = 10.0  # a client that connects while the model loads and sends nothing is let go after


def protocol_at(path: str, routes: Sequence[tuple] = ()) -> Protocol:
    """The protocol whose error shape a failure at a path is answered in (a 404, a 405, a 403 before any route
    runs): its route's, else by its prefix (Ollama's /api/..., Anthropic's /v1/messages, OpenAI's elsewhere)."""
    protocol = next((protocol for route, _, protocol, *_ in routes if route == path), None)
    return protocol or (OLLAMA if path.startswith("/api/") else ANTHROPIC if path.startswith("/v1/messages")
                        else OPENAI)


@contextlib.contextmanager
def answering_while_loading(listener: socket.socket, tls: ssl.SSLContext | None = None) -> Iterator[None]:
    """While serve's first model loads: every request on the listening socket answered 503 "Loading model"
    in its protocol's error shape (llama-server's answer then), so a client that connects meanwhile is told
    to retry rather than left waiting; the server's own app takes the socket over afterwards. A thread of
    the standard library's HTTP server, as uvicorn closes the sockets it served once it stops. tls: HTTPS's,
    where serve answers so."""
    class Loading(http.server.BaseHTTPRequestHandler):
        timeout = LOADING_READ_SECONDS  # (each connection's socket: one that never sends holds no thread for good)

        def answer(self) -> None:
            self.rfile.read(min(int(self.headers.get("Content-Length") or 0), LOADING_BODY_LIMIT))
            failure = ApiError(503, "Loading model", "unavailable_error", code="loading_model")
            body = json.dumps(protocol_at(self.path.split("?")[0]).error_body(failure)).encode()
            self.send_response(503)
            for name, value in (("Content-Type", "application/json"), ("Content-Length", str(len(body))),
                                ("Retry-After", "1"), ("Connection", "close")):
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_OPTIONS = do_PATCH = answer

        def log_message(self, format, *args) -> None:  # (said by no one: serve's log starts once it serves)
            pass

    class Door(http.server.ThreadingHTTPServer):
        def get_request(self):
            connection, address = super().get_request()
            # (the handshake is the connection's thread's, at its first read: a client that never makes one
            # holds no one else up)
            return (tls.wrap_socket(connection, server_side=True, do_handshake_on_connect=False) if tls
                    else connection), address

        def handle_error(self, request, client_address) -> None:
            pass  # a client that failed its handshake or hung up: its own trouble, not the log's

    door = Door(listener.getsockname()[:2], Loading, bind_and_activate=False)
    door.socket, door.daemon_threads = listener, True
    thread = threading.Thread(target=door.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
                              name="localspec-loading")
    thread.start()
    try:
        yield
    finally:
        door.shutdown()  # (the listening socket stays open: the caller's)
        thread.join()


def _cross_origin(serving: Serving) -> Middleware:
    """Browsers' CORS: preflights answered and responses marked readable for local pages and the
    --cors-origin ones (an API key, where set, is still asked of every request but the preflight)."""
    return Middleware(CORSMiddleware, allow_origins=list(serving.cors_origins), allow_origin_regex=LOCAL_ORIGINS,
                      allow_methods=["GET", "POST", "OPTIONS"], allow_headers=["*"], max_age=600)


class _SameSite:
    """What a web page could make a server on this machine do, refused (as Ollama refuses it):
    * a Host that names no address of this machine while serve listens on loopback: a page whose DNS
      name was rebound to 127.0.0.1 is same-origin with the server and reads every answer;
    * a request whose Origin is another site's that CORS would not admit (a form or text/plain POST,
      which browsers send without a preflight: its answer is unreadable, but it would still generate or
      pull). Clients outside a browser send no Origin (curl, the openai and ollama packages)."""

    def __init__(self, app, serving: Serving, routes: Sequence[tuple] = ()):
        self.app, self.serving, self.routes = app, serving, routes
        self.loopback = serving.host in LOOPBACK_HOSTS
        self.origins = re.compile(f"(?:{'|'.join([LOCAL_ORIGINS, *map(re.escape, serving.cors_origins)])})$")

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] in ("http", "websocket"):  # (a page's websocket is asked no CORS at all)
            headers = {key.decode("latin-1"): value.decode("latin-1") for key, value in scope["headers"]}
            why = self._refusal(headers.get("host", ""), headers.get("origin"), scope.get("method", "GET"))
            if why and scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008, "reason": why[:120]})  # (answered 403)
                return
            if why:
                body = protocol_at(scope.get("path", ""), self.routes).error_body(ApiError(403, why, code="forbidden"))
                await JSONResponse(body, status_code=403)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, host: str, origin: str | None, method: str) -> str | None:
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        name = name.strip("[]").lower()
        if self.loopback and not _local_name(name):
            return (f"Host {host!r} is not a name of this machine (a page whose DNS name was rebound to it?);"
                    " serve answers localhost and loopback addresses while it listens on loopback")
        if origin is not None and method != "OPTIONS" and not self.origins.match(origin) \
                and origin.split("://", 1)[-1] != host:  # (serve's own page, where serve is reached by another name)
            return (f"a page of {origin} may not call this server (--cors-origin {origin} allows it)")
        return None


def _local_name(name: str) -> bool:
    """Whether a Host names this machine: localhost, a loopback or private address, its own host name."""
    try:
        address = ipaddress.ip_address(name)
        return address.is_loopback or address.is_private or address.is_unspecified
    except ValueError:
        return (name in ("localhost", socket.gethostname().lower())
                or name.endswith((".localhost", ".local", ".internal")))


class _Doorkeeper:
    """What every connection is held to: how many may be open at once and how long one may stay without
    a complete request. Says once, each time the limit is reached, that new connections are closed."""

    def __init__(self, limit: int, timeout: float, log: Callable[[str], None]):
        self.limit, self.timeout, self.log = limit, timeout, log
        self.refusing = False

    def admit(self, open_now: int) -> bool:
        if open_now <= self.limit:
            self.refusing = False
            return True
        if not self.refusing:
            self.refusing = True
            self.log(f"{self.limit} connections are open, the most allowed: new ones are closed until some end"
                     f" (--max-connections; one without a complete request is closed after --timeout"
                     f" {self.timeout:g} s)")
        return False


class _Door(H11Protocol):
    """uvicorn's HTTP/1.1 connection, admitted by the doorkeeper and closed when it holds the door: no
    complete request within the timeout of opening or of its last response (headers sent a byte at a
    time kept connections open for good; uvicorn times only idle keep-alive connections), or a client
    that takes none of its answer for the timeout (requests sent one after another on a connection whose
    answers were never read held it open for good: uvicorn waits for the client to take the answer)."""

    def __init__(self, *args, keeper: _Doorkeeper, **kwargs):
        super().__init__(*args, **kwargs)
        self.keeper = keeper
        self.deadline: asyncio.TimerHandle | None = None
        self.unread: asyncio.TimerHandle | None = None  # set while the answer waits for the client to read

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.unread is None:
            self.unread = self.loop.call_later(self.keeper.timeout, self._cut_off_a_client_that_does_not_read)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.unread is not None:
            self.unread.cancel()
            self.unread = None

    def _cut_off_a_client_that_does_not_read(self) -> None:
        self.unread = None
        if not self.transport.is_closing():
            self.transport.abort()  # (close would wait for the unread answer to be sent first)

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if not self.keeper.admit(len(self.connections)):
            transport.close()
            return
        self._wait_for_a_request()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._wait_for_a_request()

    def handle_websocket_upgrade(self, event) -> None:
        self._stop_timers()  # (a websocket's time is its own: the SDK's sockets stay open while its client lives)
        super().handle_websocket_upgrade(event)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timers()
        super().connection_lost(exc)

    def _stop_timers(self) -> None:
        for timer in (self.deadline, self.unread):
            if timer is not None:
                timer.cancel()

    def _wait_for_a_request(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
        self.deadline = self.loop.call_later(self.keeper.timeout, self._close_without_a_request)

    def _close_without_a_request(self) -> None:
        # a request whose headers are complete is being answered: its time is the service's to bound
        if (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing():
            self.transport.close()


class _Uvicorn(uvicorn.Server):
    """uvicorn, stopping on Ctrl-C or SIGTERM by cancelling the generations first (at their next step)
    and exiting normally."""

    def __init__(self, config: uvicorn.Config, on_ready: Callable[[], None], on_exit: Callable[[], None]):
        super().__init__(config)
        self.on_ready, self.on_exit = on_ready, on_exit

    @contextlib.contextmanager
    def capture_signals(self):
        # uvicorn raises the signal again once it has shut down, which would end the process as killed
        # by it; stopping on request is a normal exit here.
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    async def startup(self, sockets=None) -> None:
        # said once Ctrl-C and SIGTERM are ours (capture_signals wraps this): a stop asked for the moment
        # "serving" is read is a normal exit, never a KeyboardInterrupt
        await super().startup(sockets)
        if not self.should_exit:
            self.on_ready()

    async def shutdown(self, sockets=None) -> None:
        self.on_exit()
        await super().shutdown(sockets)


class _Framing:
    """One answer's stream as its protocol frames it (frames): what opens it at its first item, then each
    item's thinking, text and tool calls (read from the text where the model was offered tools), each
    piece of text carrying the tokens it came of where their logprobs were asked for or the protocol frames
    their ids."""

    def __init__(self, job: Job, frames: Answering):
        self.job, self.frames = job, frames
        self.reader = None
        self.started = False
        self.calls = 0
        self.pending: list[Token] = []  # the answer's tokens, until a piece of text carries them

    def of(self, item) -> list[str]:
        if self.frames.every_event:
            return self.frames.event(item)
        if isinstance(item, Reading) and not self.frames.shows_reading:
            return [self.frames.keepalive]  # (before the opening, which says what the reading found)
        out = []
        if not self.started:
            self.started = True
            out += self.frames.opening(self.job)
            self.reader = tool_reader(self.job)  # (the worker has read the request's tools by its first event)
        if isinstance(item, Reading):
            return out + self.frames.reading(self.job, item)
        thought = item.thought if isinstance(item, Token) else item.thought_tail if isinstance(item, Done) else ""
        if thought:
            out.append(self.frames.thought(thought))
        if isinstance(item, Token) and (self.frames.token_ids or item.logprobs and not item.thinking):
            # (a thinking token's id rides with the answer's next piece; its logprobs are not the answer's)
            self.pending.append(replace(item, logprobs=None) if item.thinking else item)
        text = item.text if isinstance(item, Token) else item.tail if isinstance(item, Done) else ""
        if text:
            out += self._framed(self.reader.feed(text) if self.reader else [text])
        return out

    def ending(self) -> list[str]:
        """What is left once the answer is whole: calls the reader still held, and the tokens whose text never
        showed (a stop string's, a tool call's), theirs all the same."""
        out = self._framed(self.reader.end()) if self.reader else []
        if self.pending:
            out.append(self.frames.piece("", self.pending))
            self.pending = []
        return out

    def _framed(self, pieces: list) -> list[str]:  # content, or the answer's tool calls
        out = []
        for piece in pieces:
            if isinstance(piece, str):
                out.append(self.frames.piece(piece, self.pending) if self.pending else self.frames.piece(piece))
                self.pending = []
            else:
                out.append(self.frames.call(piece, self.calls))
                self.calls += 1
        return out


def _deliverer(outbox: asyncio.Queue, stream: bool, choice: int, every: bool = False, reading: bool = False
               ) -> Callable:
    """What hands a job's items to the request's handler (called on the worker thread), as (choice, item):
    a request's choices share the outbox. Each hand-over wakes the event loop, which then competes
    with llama.cpp's threads for the CPU: after the first event (the request has started: its prompt read), only
    what the response is made of is handed over (every event, where its protocol streams them all); the job's
    recorder has the rest. A long prompt's reading is handed over only where it is streamed (every, or reading:
    a stream that shows it, or keeps itself open while it goes on), and then starts the request."""
    loop = asyncio.get_running_loop()
    started = False

    def deliver(item) -> None:
        nonlocal started
        if isinstance(item, Reading):
            if not (every or reading and stream):
                return
        elif started and not every and not _makes_the_response(item, stream):
            return
        started = True
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is waiting any more
            loop.call_soon_threadsafe(outbox.put_nowait, (choice, item))

    return deliver


def _makes_the_response(item, stream: bool) -> bool:
    """Errors and the end always; a stream's tokens (its text, a reasoning model's thinking, the ids and logprobs of
    tokens whose text is held back) and its held-back tail."""
    if isinstance(item, LocalspecError) or item is FINISHED:
        return True
    return stream and isinstance(item, Done | Token)


def _form(data: bytes, content_type: str) -> tuple[dict[str, str], bytes | None]:
    """A multipart/form-data body's text fields and its "file" part's bytes (read with the standard library's MIME
    parser); a 400 where it is none."""
    if not content_type.lower().startswith("multipart/form-data"):
        raise ApiError(400, "the request body must be multipart/form-data (the audio file as \"file\")",
                       code="invalid_request")
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + bytes(data))
    if not message.is_multipart():
        raise ApiError(400, "the multipart body could not be read", code="invalid_request")
    fields, audio = {}, None
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True) or b""
        if name == "file":
            audio = payload
        elif name:
            fields[name] = payload.decode("utf-8", errors="replace")
    return fields, audio


class _Socket:
    """A websocket as sdk_sockets.py reads it: text in and out, SocketGone where its client has gone."""

    def __init__(self, websocket: WebSocket):
        self.request = websocket
        self.host = websocket.client.host if websocket.client else None

    async def accept(self) -> None:
        await self.request.accept()

    async def receive(self) -> str:
        message = await self.request.receive()
        if message["type"] == "websocket.disconnect":
            raise SocketGone
        return message.get("text") or (message.get("bytes") or b"").decode("utf-8", "replace")

    async def send(self, text: str) -> None:
        try:
            await self.request.send_text(text)
        except (WebSocketDisconnect, RuntimeError, OSError):  # (uvicorn's ClientDisconnected is an OSError)
            raise SocketGone from None


def _answered_as(parsed: Parsed, served: Served) -> str:
    """The model an OpenAI answer names: the model that answered (a client's fixed name is not it), or the
    model made with `create` that the request named."""
    return parsed.made or served.name


def _made_of(body: dict) -> store.Preset | None:
    """The model made with `create` that a request's body names, if it names one."""
    return store.made(body["model"]) if isinstance(body.get("model"), str) else None


def _as_made(defaults: Defaults, made: store.Preset | None) -> Defaults:
    """What a request for a model made with `create` leaves out gets: its parameters over serve's settings."""
    if made is None:
        return defaults
    try:
        sampling, limits = made.settings(defaults.sampling, defaults.limits)
    except UsageError as error:
        raise ApiError(500, f"{made.name}'s Modelfile: {error}") from None
    return replace(defaults, sampling=sampling, limits=limits)


def _named(name):
    """A request's model name: a string, or None where it names none; a 400 where it is anything else."""
    if name is not None and not isinstance(name, str):
        raise ApiError(400, "model: a model's name is a string", param="model")
    return name


def _who(request: Request, client: str | None) -> str | None:
    """The client a request counts against (Service.submit): its API key, else the address it came from."""
    return client or (request.client.host if request.client else None)


async def _cancel_when_gone(request: Request, jobs: list[Job]) -> None:
    """Cancel the request's jobs (those started by then) when its client disconnects (the request body has
    been read, so the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    for job in jobs:
        job.cancel()


async def _pulled(fetching: asyncio.Future, statuses: asyncio.Queue, log) -> AsyncIterator[str]:
    """A pull's statuses as they come, then success, or the error that ended it."""
    while True:
        waiting = asyncio.ensure_future(statuses.get())
        await asyncio.wait({waiting, fetching}, return_when=asyncio.FIRST_COMPLETED)
        if waiting.done():
            yield json.dumps(waiting.result()) + "\n"
            continue
        waiting.cancel()
        while not statuses.empty():  # posted before the thread returned: all in the queue by now
            yield json.dumps(statuses.get_nowait()) + "\n"
        failure = fetching.exception()
        if failure is not None and not isinstance(failure, LocalspecError):
            log("".join(traceback.format_exception(failure)).rstrip())
        yield json.dumps({"error": str(failure)} if failure else {"status": "success"}) + "\n"
        return
