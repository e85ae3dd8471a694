"""One generation asked of a session: what every face hands the library (serve's protocols, batch, run,
chat, bench, a program that imports localspec)."""

import base64
import secrets
from dataclasses import asdict, dataclass
from enum import Enum

from .config import DrafterKind, Limits, Sampling, Thinking, of_its_type
from .engine.drafters.spec import KINDS
from .errors import UsageError
from .tool_calls import Tools


# Where a message's content places one of its images (a message's `images`, in order): a string no client can
# guess, so that no text forges an image's place (llama-server's marker is random so too)
IMAGE_MARKER = f"<__image_{secrets.token_hex(12)}__>"


class Opening(str, Enum):
    """Where a conversation's reply begins (llama-server's and vLLM's add_generation_prompt and
    continue_final_message name them)."""

    NEW = "new"  # a turn of the assistant's, opened after the last message whoever wrote it
    NONE = "none"  # no turn opened: the conversation read on as its template writes it
    # the last message, the assistant's reply so far, gone on from: in its text, else in its thinking where it has
    # only that (as llama-server goes on from one)
    CONTINUED = "continued"
    ANSWER = "answer"  # in its text, its thinking (where it has one) closed before it: a prefill
    THINKING = "thinking"  # in its thinking: the reply thinks on from it, then answers


MESSAGE_ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Request:
    """What to answer and how.

    messages: a conversation (role and content each), rendered with the model's chat template for the
    assistant's turn; prompt: instead, text read as written (control tokens and all, as OpenAI's and
    llama.cpp's completions read it) or token ids. suffix: with a text prompt, the text that comes after what
    is asked for (code after the cursor): the model fills in the middle with its FIM tokens, as Ollama's
    `suffix` asks (Prompts.fill_in). sampling: how tokens are chosen, a grammar or JSON
    schema's among it (prompts.output_grammar makes one); limits: how long it may run and where it stops.
    prediction: the text the answer is expected to follow (OpenAI's Predicted Outputs), drafted wherever
    it does, or its tokens as Session.prediction_tokens made them. tools: the tools a conversation's answer may call, their calls kept well formed by a grammar.
    thinking: how a reasoning model thinks before it answers (whether, how hard, how long).
    template_variables: more the chat template reads, as llama-server's chat_template_kwargs hand them on (a
    Llama 3.1 template's date_string, a model's own switch: DeepSeek V3.1's thinking, StepFun's
    preserve_thinking); the thinking's own (enable_thinking, reasoning_effort) are thinking's to set.
    drafting, draft_max: how this generation drafts, other than the session's mode and --draft-max where given
    (serve's per-request speculation): plain for one request leaves the others drafting.
    client: whose request it is (serve's API key): it drafts only from its own client's earlier answers
    and reuses no cache another client filled. continues: token ids the prompt follows, read before it (an
    earlier exchange as Ollama's `context` hands it back: its prompt's tokens and its answer's). lora: the
    LoRA adapters' scales it is answered with, by adapter id (the order they were loaded in; those not named
    0, as llama-server's `lora` field); None: the session's own (--lora's, or serve's POST /lora-adapters').
    opening: where a conversation's reply begins (Opening); None: as the conversation says, as llama-server reads
    it (the assistant's message last: gone on from, CONTINUED; else NEW)."""

    sampling: Sampling = Sampling()
    limits: Limits = Limits()
    messages: list[dict] | None = None
    prompt: str | list[int] | None = None
    suffix: str | None = None
    prediction: str | list[int] | None = None
    tools: Tools | None = None
    client: str | None = None
    thinking: Thinking = Thinking()
    template_variables: dict | None = None
    drafting: DrafterKind | None = None
    draft_max: int | None = None
    continues: list[int] | None = None
    lora: dict[int, float] | None = None
    opening: Opening | None = None

    def __post_init__(self):
        """A library caller's request checked as every other way in checks one (a role of its own, "robot", reached
        the template; Request("greedy") or tools as OpenAI's list failed in the engine with a traceback)."""
        for name, kind in (("sampling", Sampling), ("limits", Limits), ("thinking", Thinking)):
            if not isinstance(getattr(self, name), kind):
                raise UsageError(f"a Request's {name} is a localspec.{kind.__name__}, got {getattr(self, name)!r:.80}",
                                 setting=name)
        if self.messages is not None:
            if not (isinstance(self.messages, list) and all(
                    isinstance(m, dict) and m.get("role") in MESSAGE_ROLES and isinstance(m.get("content"), str)
                    for m in self.messages)):
                raise UsageError("messages: a list of {\"role\": system, user, assistant or tool, \"content\": text}"
                                 f" objects, got {self.messages!r:.80}", setting="messages")
            if self.prompt is not None:
                raise UsageError("a Request has messages or a prompt, not both", setting="prompt")
        if self.tools is not None and not isinstance(self.tools, Tools):  # (OpenAI's list of tools, as its API takes)
            object.__setattr__(self, "tools", Tools.of(self.tools))

    @property
    def characters(self) -> int:
        """The length of the prompt's text (of its messages' contents; 0 for token ids)."""
        if self.messages is not None:
            return sum(len(message["content"]) for message in self.messages)
        return len(self.prompt) + len(self.suffix or "") if isinstance(self.prompt, str) else 0


def to_wire(request: Request) -> dict:
    """A request as JSON, for serve's own stream (tools, which `run` and `chat` never send, are left out)."""
    return {"sampling": asdict(request.sampling), "limits": asdict(request.limits),
            "thinking": asdict(request.thinking), "template_variables": request.template_variables,
            "messages": request.messages and [message_as_json(message) for message in request.messages],
            "prompt": request.prompt,
            "suffix": request.suffix, "prediction": request.prediction, "drafting": request.drafting,
            "draft_max": request.draft_max}


def from_wire(data: dict) -> Request:
    """The request to_wire wrote; UsageError naming what is wrong where it is not one."""
    def part(kind, name: str, tuples: tuple[str, ...] = ()):
        values = {} if data.get(name) is None else data[name]
        if not isinstance(values, dict):  # (a [] was taken as no settings: a request ran without its limits)
            raise UsageError(f"{name}: an object of settings", setting=name)
        try:
            return kind(**{key: tuple(value) if key in tuples and isinstance(value, list) else value
                           for key, value in values.items()})
        except TypeError as error:
            raise UsageError(f"{name}: {error}", setting=name) from None

    messages, prompt = data.get("messages"), data.get("prompt")
    if (messages is None) == (prompt is None):
        raise UsageError("give messages or a prompt", setting="messages")
    if messages is not None and not (isinstance(messages, list) and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages)):
        raise UsageError("messages: a list of {role, content} objects", setting="messages")
    if messages is not None:
        messages = [message_of_json(message) for message in messages]
    if prompt is not None and not (isinstance(prompt, str) or isinstance(prompt, list)
                                   and all(isinstance(t, int) for t in prompt)):
        raise UsageError("prompt: text or token ids", setting="prompt")
    suffix = data.get("suffix")
    if suffix is not None and not isinstance(suffix, str):
        raise UsageError("suffix: text", setting="suffix")
    prediction = data.get("prediction")
    if prediction is not None and not (isinstance(prediction, str) or isinstance(prediction, list)
                                       and all(isinstance(t, int) for t in prediction)):
        raise UsageError("prediction: text or token ids", setting="prediction")
    drafting = data.get("drafting")
    if drafting is not None and not (isinstance(drafting, str) and drafting in KINDS):
        raise UsageError(f"drafting: one of {', '.join(KINDS)}", setting="drafting")
    draft_max = data.get("draft_max")
    if draft_max is not None and of_its_type("draft_max", draft_max, int) < 0:
        raise UsageError(f"draft_max must be a count of tokens, got {draft_max!r}", setting="draft_max")
    variables = data.get("template_variables")
    if variables is not None and not isinstance(variables, dict):
        raise UsageError("template_variables: an object of the chat template's variables", setting="template_variables")
    return Request(part(Sampling, "sampling", ("grammar_triggers",)), part(Limits, "limits", ("stop",)),
                   messages=messages, prompt=prompt, suffix=suffix, prediction=prediction,
                   thinking=part(Thinking, "thinking"), template_variables=variables,
                   drafting=DrafterKind(drafting) if drafting else None,
                   draft_max=None if draft_max is None else int(draft_max))


def message_as_json(message: dict) -> dict:
    """A message as JSON carries it: its images (`images`) as base64 text."""
    return _images_as(message, lambda image: base64.b64encode(image).decode("ascii"))


def message_of_json(message: dict) -> dict:
    """A message message_as_json wrote, its images as bytes again (UsageError where one is no base64 text)."""
    return _images_as(message, image_of_base64)


def _images_as(message: dict, kind) -> dict:
    images = message.get("images")
    if images is None:
        return message
    if not isinstance(images, list):
        raise UsageError("messages: a message's images are a list", setting="messages")
    return message | {"images": [kind(image) for image in images]}


def image_of_base64(image) -> bytes:
    """An image file's bytes from its base64 text (UsageError where it is none)."""
    try:
        return base64.b64decode(image, validate=True)
    except (TypeError, ValueError):
        raise UsageError("messages: an image is base64 text", setting="messages") from None
