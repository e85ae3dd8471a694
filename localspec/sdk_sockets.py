"""LM Studio's SDKs' websockets on serve: a socket a namespace (/llm, /embedding, /system, /files, /repository), its
messages read and answered as protocols/lmstudio_sdk.py says them, each call and channel done by what serve does for
the HTTP routes that mean the same (a model found or loaded, a request parsed and streamed, a download begun)."""

import asyncio
import json
import traceback
from dataclasses import replace
from pathlib import Path
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from . import __version__, store
from .errors import InputError, LocalspecError, UnknownModel, UsageError, loads_json
from .config import Serving
from .pool import Pool, Served
from .protocols import llama_server, lmstudio, lmstudio_sdk
from .protocols.openai import OPENAI
from .protocols.shared import ApiError, Answering, Parsed, Protocol as Api, api_error, choices_of, rendered
from .request import Request as LibraryRequest
from .service import Embedding, Job


class SocketGone(Exception):
    """The client of a socket has gone (its socket closed, or a message to it could not be sent)."""


class Socket(Protocol):
    """A websocket as it is read here (server.py makes one of the web framework's): its text messages, SocketGone
    where its client has gone; request, what serve's own checks read of it (the key it came with)."""

    request: object
    host: str | None

    async def accept(self) -> None: ...

    async def receive(self) -> str: ...

    async def send(self, text: str) -> None: ...


class Host(Protocol):
    """What a socket takes of serve (server.py's Server, which makes the sockets): the HTTP routes' own steps, so
    that a call here is done as the route that means the same does it."""

    pool: Pool
    serving: Serving
    sdk_uploads: lmstudio_sdk.Uploads
    log: Callable[[str], None]

    def _say_once(self, key: tuple, line: str) -> None: ...

    def _client(self, request) -> str | None: ...

    def _may_change_models(self, what: str) -> None: ...

    def _unless_offline(self, name: str, wanted: store.Resolved) -> None: ...

    def download(self, name: str, wanted: store.Resolved, stopped: Callable[[], str]) -> lmstudio.Download: ...

    async def _model(self, name, keep_alive: float | None = None, known_only: bool = False) -> Served: ...

    async def _done(self, work: Embedding, client: str | None, served: Served, request, param: str | None) -> Job: ...

    async def _parse(self, body: dict, chat: bool, protocol: Api, served: Served) -> Parsed | None: ...

    def _fitted(self, parsed: Parsed, served: Served) -> Parsed: ...

    def _draft_asked(self, extras: lmstudio.Extras, served: Served) -> None: ...

    async def _started(self, asked_all: list[LibraryRequest], stream: bool, answering: Answering, served: Served,
                       who: str | None, jobs: list[Job], outbox: asyncio.Queue) -> tuple: ...

    def _stream(self, jobs: list[Job], reply: Answering, first, outbox: asyncio.Queue, path: str,
                watcher: asyncio.Task | None) -> AsyncIterator[str]: ...


class SdkSocket:
    """One websocket of LM Studio's SDKs, a namespace's (protocols/lmstudio_sdk.py): its opening answered, then each
    remote call and channel served on a task of its own (a long prediction leaves the socket's other calls
    answered), at most MOST_AT_ONCE at a time, its messages sent one at a time; a channel's cancel stops its
    generation, and the socket's end everything it started."""

    MOST_AT_ONCE = 64
    LOAD_WORD_SECONDS = 10  # a load says it goes on this often: the SDK gives up on a channel silent for 60 s
    DOWNLOAD_WORD_SECONDS = 1  # (a download's progress, as LM Studio says it)

    def __init__(self, server: Host, namespace: str, socket: Socket):
        self.server, self.namespace, self.socket = server, namespace, socket
        self.identity = ""  # the client's, which its sockets share (an image uploaded on one is named on another)
        self.key: str | None = None  # the API key it came with, where serve has keys
        self.tasks: set[asyncio.Task] = set()
        self.jobs: dict = {}  # the generations of each channel, by its id
        self.cancelled: set = set()  # channels cancelled (before their generation began, too), by id
        self.gone = False  # (its client: what it began stops, a download on its thread too)
        self.sending = asyncio.Lock()

    async def run(self) -> None:
        await self.socket.accept()
        try:
            if await self._opened():
                while True:
                    self._take(await self._received())
        except SocketGone:
            pass
        finally:
            self.gone = True
            for jobs in self.jobs.values():
                for job in jobs:
                    job.cancel()
            for task in self.tasks:
                task.cancel()

    async def _received(self):
        """The next message (a JSON value: null too); a message that is no JSON is warned of."""
        while True:
            text = await self.socket.receive()
            try:
                return loads_json(text)
            except (ValueError, RecursionError):  # (JSON nested deeper than Python's stack is the second)
                await self._send({"type": "communicationWarning", "warning": "a message that is no JSON was dropped"})

    async def _opened(self) -> bool:
        """The client's identity read and answered: success, or why it may not (serve's API key, which LM Studio's
        SDKs cannot send, unless the socket's request carried it)."""
        hello = await self._received()
        if not isinstance(hello, dict) or "authVersion" not in hello:
            await self._send({"success": False, "error": lmstudio_sdk.error(
                "a socket opens with the client's identity ({\"authVersion\": 1, \"clientIdentifier\": ...})")})
            return False
        try:
            self.key = self.server._client(self.socket.request)
        except ApiError as failure:
            await self._send({"success": False, "error": lmstudio_sdk.error(
                f"{failure.message}; LM Studio's SDKs send no key: serve them without --api-key")})
            return False
        self.identity = str(hello.get("clientIdentifier") or id(self))
        await self._send(lmstudio_sdk.AUTHENTICATED)
        return True

    def _take(self, message) -> None:
        kind = message.get("type") if isinstance(message, dict) else None
        named = lmstudio_sdk.named_by(message) if kind else None
        if kind in ("rpcCall", "channelCreate", "channelSend") and named is None:
            self._start(self._send({"type": "communicationWarning", "warning": f"a {kind} without its"
                                    f" {'callId' if kind == 'rpcCall' else 'channelId'} (a number) was dropped"}))
            return
        if kind == "channelSend":
            if lmstudio_sdk.cancels(message):
                self.cancelled.add(named)
                for job in self.jobs.get(named, ()):
                    job.cancel()
            return
        if kind == "communicationWarning":  # (what the client found wrong in a message of ours: never answered)
            self.server._say_once(("sdk warning", str(message.get("warning"))[:200]),
                                  f"LM Studio's SDK warned: {str(message.get('warning'))[:500]}")
            return
        if kind not in ("rpcCall", "channelCreate"):
            self._start(self._send({"type": "communicationWarning", "warning": f"a message of type {kind!r} was"
                                    " dropped: rpcCall, channelCreate and channelSend are read"}))
            return
        if len(self.tasks) >= self.MOST_AT_ONCE:
            failure = lmstudio_sdk.error(f"{self.MOST_AT_ONCE} calls and channels of this socket are running: wait"
                                         " for one to end")
            self._start(self._send(lmstudio_sdk.rpc_error(message.get("callId"), failure) if kind == "rpcCall"
                                   else lmstudio_sdk.channel_error(message.get("channelId"), failure)))
            return
        self._start(self._call(message) if kind == "rpcCall" else self._channel(message))

    def _start(self, work) -> None:
        task = asyncio.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None \
                and not isinstance(task.exception(), SocketGone):
            self.server.log("".join(traceback.format_exception(task.exception())).rstrip())

    async def _send(self, message) -> None:
        await self._send_frame(json.dumps(message, ensure_ascii=False))

    async def _send_frame(self, frame: str) -> None:
        """A frame's messages, a line each (a Prediction's frame may say several)."""
        async with self.sending:
            for line in frame.splitlines():
                await self.socket.send(line)

    def _error(self, error: Exception) -> dict:
        if isinstance(error, (UsageError, InputError)):  # (as a route's boundary answers them)
            error = api_error(error)
        if isinstance(error, UnknownModel):
            return lmstudio_sdk.error(str(error), not_found=True)
        if isinstance(error, ApiError):
            return lmstudio_sdk.error(error.message, not_found=error.code == "model_not_found")
        self.server.log(traceback.format_exc().rstrip())
        return lmstudio_sdk.error(f"internal error: {error}")

    async def _call(self, message: dict) -> None:
        call_id = message.get("callId")
        try:
            answer = lmstudio_sdk.rpc_result(call_id, await self._answer(message.get("endpoint"),
                                                                         message.get("parameter")))
        except Exception as error:
            answer = lmstudio_sdk.rpc_error(call_id, self._error(error))
        await self._send(answer)

    async def _answer(self, endpoint, parameter):
        """A remote call's result."""
        parameter = parameter if isinstance(parameter, dict) else {}
        pool = self.server.pool
        if self.namespace == "system" and endpoint == "listDownloadedModels":
            return [self._info(available) for available in pool.available()]
        if self.namespace == "system" and endpoint == "version":
            return {"version": __version__, "build": 0}
        if self.namespace == "files" and endpoint == "uploadFileBase64":
            return self.server.sdk_uploads.add(self.identity, parameter)
        if self.namespace == "repository" and endpoint == "searchModels":
            asked = lmstudio_sdk.search_asked(parameter)
            if asked is None:
                return {"results": []}
            found, note = await asyncio.to_thread(store.search, *asked, self.server.serving.offline)
            if note:
                self.server._say_once(("search", note), f"LM Studio's SDK searched the registry alone: {note}")
            return lmstudio_sdk.found(found, asked[0])
        if self.namespace == "repository" and endpoint == "getModelDownloadOptions":
            name = lmstudio_sdk.download_options_asked(parameter)
            try:
                return lmstudio_sdk.download_options(name, await asyncio.to_thread(
                    store.quantizations, name, self.server.serving.offline))
            except LocalspecError as error:
                raise ApiError(404, str(error), code="model_not_found") from None
        if self.namespace in ("llm", "embedding"):
            if endpoint == "listLoaded":
                return [self._info(pool.find(served.name), served) for served in pool.loaded.values()
                        if self._ours(served.session.target_info)]
            if endpoint == "unloadModel":
                name = lmstudio_sdk.specified({"type": "query", "query": {"identifier": parameter.get("identifier")}})
                if not await pool.unload_when_idle(name):
                    raise ApiError(400, f"{name} is the model serve started with: it stays loaded while serve runs")
                return None
            calls = {"getModelInfo": self._model_info, "getLoadConfig": self._load_config, "tokenize": self._tokens,
                     "countTokens": self._tokens, "embedString": self._embedding,
                     "applyPromptTemplate": self._prompt_template}
            call = calls.get(endpoint) if isinstance(endpoint, str) else None
            if call is None:  # (an unknown one was "a model specifier is an object, not None")
                raise ApiError(400, f"{endpoint!r} is not an endpoint localspec serves on /{self.namespace}",
                               code="not_implemented")
            served = self._loaded(lmstudio_sdk.specified(parameter.get("specifier", parameter.get("modelSpecifier"))))
            answer = await call(endpoint, served, parameter)
            if answer is not None:
                return answer
        raise ApiError(400, f"{endpoint!r} with these parameters is not served by localspec on /{self.namespace}",
                       code="not_implemented")

    async def _model_info(self, endpoint: str, served: Served, parameter: dict) -> dict:
        return self._info(self.server.pool.find(served.name), served)

    async def _load_config(self, endpoint: str, served: Served, parameter: dict) -> dict:
        return lmstudio_sdk.load_config(served.session)

    async def _tokens(self, endpoint: str, served: Served, parameter: dict) -> dict | None:
        text = parameter.get("inputString")
        if not isinstance(text, str):
            return None
        tokens = (await asyncio.to_thread(llama_server.tokenized, served.session, {"content": text}))["tokens"]
        return {"tokens": tokens} if endpoint == "tokenize" else {"tokenCount": len(tokens)}

    async def _embedding(self, endpoint: str, served: Served, parameter: dict) -> dict | None:
        text = parameter.get("inputString")
        if self.namespace != "embedding" or not isinstance(text, str):
            return None
        job = await self.server._done(Embedding([text], self.key), self.key, served, self.socket.request, "inputString")
        return {"embedding": job.embeddings[0]}

    async def _prompt_template(self, endpoint: str, served: Served, parameter: dict) -> dict | None:
        if self.namespace != "llm":
            return None
        asked = lmstudio_sdk.prediction_asked(parameter, self._upload)
        tools = lmstudio_sdk.tool_definitions(parameter)
        body = asked.body | ({"tools": tools} if tools else {})
        parsed = await self.server._parse(body, asked.chat, OPENAI, served)
        return {"formatted": await asyncio.to_thread(rendered, served.session, parsed.request)}

    def _ours(self, info) -> bool:
        """Whether a model is this namespace's: a generating one /llm's, an embedding one /embedding's."""
        return info.generates == (self.namespace == "llm")

    def _info(self, available: store.Local, served: Served | None = None) -> dict:
        return lmstudio_sdk.model_info(available.name, self.server.pool.header(available.path), available.entry,
                                       served and served.session)

    def _loaded(self, name: str | None) -> Served:
        """The loaded model a call names (where it names none: the first of this namespace's loaded)."""
        pool = self.server.pool
        served = pool.loaded.get(pool.find(name).key) if name else next(
            (served for served in pool.loaded.values() if self._ours(served.session.target_info)), None)
        if served is None:
            raise ApiError(404, f"no model {name or 'of this kind'} is loaded (the SDK's llm(name) loads one)",
                           code="model_not_found")
        return served

    def _upload(self, identifier) -> tuple[str, bytes] | None:
        return self.server.sdk_uploads.get(self.identity, identifier)

    async def _channel(self, message: dict) -> None:
        channel_id, endpoint = message.get("channelId"), message.get("endpoint")
        creation = message.get("creationParameter")
        try:
            if not isinstance(creation, dict):
                raise ApiError(400, f"a {endpoint} channel is created with its parameter (creationParameter)")
            if endpoint in ("getOrLoad", "loadModel") and self.namespace in ("llm", "embedding"):
                await self._load(channel_id, endpoint, creation)
            elif endpoint == "predict" and self.namespace == "llm":
                await self._predict(channel_id, creation)
            elif endpoint == "downloadModel" and self.namespace == "repository":
                await self._download(channel_id, creation)
            else:
                raise ApiError(400, f"a {endpoint!r} channel is not served by localspec on /{self.namespace}")
        except Exception as error:
            await self._send(lmstudio_sdk.channel_error(channel_id, self._error(error)))
        finally:
            self.jobs.pop(channel_id, None)
            self.cancelled.discard(channel_id)

    async def _load(self, channel_id, endpoint: str, creation: dict) -> None:
        """getOrLoad (the SDK's llm(name)) and loadModel: the model loaded where it is not, saying it goes on while it
        loads; its instance is the model's own, named as the model."""
        pool = self.server.pool
        name = creation.get("identifier" if endpoint == "getOrLoad" else "modelKey")
        ttl = creation.get("loadTtlMs" if endpoint == "getOrLoad" else "ttlMs")
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or ttl < 0):
            raise ApiError(400, f"a model's ttl is a number of milliseconds, not {ttl!r}")
        available = pool.find(lmstudio_sdk.specified({"type": "query", "query": {"identifier": name}}))
        info = pool.header(available.path)
        if not self._ours(info):
            raise ApiError(404, f"{available.name} is {'an embedding' if info.generates is False else 'a generating'}"
                           f" model: /{'embedding' if self.namespace == 'llm' else 'llm'} serves it",
                           code="model_not_found")
        already = available.key in pool.loaded
        if not already:
            await self._send(lmstudio_sdk.channel_send(channel_id, {"type": "startLoading", "identifier":
                                                                    available.name, "info": self._info(available)}))
        loading = asyncio.ensure_future(self.server._model(available.name, None if ttl is None else ttl / 1000,
                                                           known_only=True))
        try:
            while not (await asyncio.wait({loading}, timeout=self.LOAD_WORD_SECONDS))[0]:
                await self._send(lmstudio_sdk.channel_send(channel_id, {
                    "type": "loadProgress" if endpoint == "getOrLoad" else "progress", "progress": 0.0}))
        finally:
            loading.cancel()  # (a no-op once loaded; the pool finishes a load its asker left)
        served = loading.result()
        wanted = lmstudio_sdk.collapsed(creation.get("loadConfigStack"), "loadConfigStack").get(
            f"{self.namespace}.load.contextLength")
        if isinstance(wanted, int) and wanted > served.session.info.n_ctx:
            self.server._say_once(("contextLength", served.name, wanted), f"a context of {wanted} tokens asked:"
                                  f" {served.name} is loaded with {served.session.info.n_ctx} (serve's -c sets it)")
        ended = "alreadyLoaded" if already else "loadSuccess" if endpoint == "getOrLoad" else "success"
        await self._send(lmstudio_sdk.channel_send(channel_id, {"type": ended, "info": self._info(available, served)}))

    async def _download(self, channel_id, creation: dict) -> None:
        """downloadModel: a model fetched as `localspec pull` fetches it (hf:owner/repo/file.gguf or a registry name,
        as getModelDownloadOptions names them), its progress said every DOWNLOAD_WORD_SECONDS; a cancel stops it,
        what arrived kept for the next download to go on from."""
        name = creation.get("downloadIdentifier")
        if not isinstance(name, str) or not name:
            raise ApiError(400, "downloadIdentifier names the file to download, as getModelDownloadOptions named it")
        self.server._may_change_models("downloads")
        try:
            wanted = store.find(name)
        except LocalspecError as error:
            raise ApiError(404, str(error), code="model_not_found") from None
        if isinstance(wanted, Path):
            raise ApiError(400, f"{name!r} is a file on this machine: nothing to download")
        self.server._unless_offline(name, wanted)
        job = self.server.download(name, wanted, lambda: "cancelled" if channel_id in self.cancelled else
                                   "its client has gone" if self.gone else "")
        while not (await asyncio.wait({job.fetching}, timeout=self.DOWNLOAD_WORD_SECONDS))[0]:
            await self._send(lmstudio_sdk.channel_send(channel_id, lmstudio_sdk.download_progress(*job.progress())))
        if job.error:
            raise ApiError(500, job.error)
        await self._send(lmstudio_sdk.channel_send(channel_id, {"type": "startFinalizing"}))
        await self._send(lmstudio_sdk.channel_send(channel_id, {"type": "success", "defaultIdentifier": name}))

    async def _predict(self, channel_id, creation: dict) -> None:
        """A prediction: the history and configuration read as the OpenAI request they amount to, answered as the
        SDK's fragments and success (lmstudio_sdk.Prediction)."""
        asked = lmstudio_sdk.prediction_asked(creation, self._upload)
        served = await self.server._model(lmstudio_sdk.specified(creation.get("modelSpecifier")), known_only=True)
        parsed = await self.server._parse(asked.body, asked.chat, OPENAI, served)
        if asked.fits:
            parsed = await asyncio.to_thread(self.server._fitted, replace(parsed, fits=True), served)
        self.server._draft_asked(lmstudio.extras(asked.body), served)
        for key in asked.left_to_serve:
            self.server._say_once(("lmstudio", key), f"{key} asked (LM Studio's SDK): left to serve's settings")
        parsed = replace(parsed, request=replace(parsed.request, client=self.key))
        answering = lmstudio_sdk.Prediction(channel_id, asked.chat, served.name, parsed, served.session,
                                            self._info(self.server.pool.find(served.name), served))
        jobs, outbox = self.jobs.setdefault(channel_id, []), asyncio.Queue()
        who = self.key or self.socket.host
        try:
            if channel_id in self.cancelled:  # (before its generation began: it begins in the same step as this)
                raise ApiError(503, "cancelled before it began", code="cancelled")
            first = await self.server._started(choices_of(parsed), parsed.stream, answering, served, who, jobs, outbox)
        except ApiError as failure:
            if failure.code != "cancelled":
                raise
            await self._send_frame(answering.error(failure))  # (stopped before its prompt was read)
            return
        async for frame in self.server._stream(jobs, answering, first, outbox, f"/{self.namespace} predict", None):
            await self._send_frame(frame)
