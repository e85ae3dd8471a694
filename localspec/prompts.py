"""Prompts as a model reads them: a conversation through its chat template (with the tools it may call),
text as written, token ids checked against its vocabulary, a prediction's tokens, and the guards that
refuse what cannot fit its context before any time goes into it."""

import functools
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from . import reasoning
from .chat_template import render, render_pieces
from .config import Sampling, Thinking
from .engine.gbnf import from_choices, from_json_schema, from_regex, json_object
from .engine.model import Model
from .engine.vision import Vision, is_audio, media_runs
from .errors import ContextOverflow, InputError, UsageError
from .request import IMAGE_MARKER, Opening, Request
from .tool_calls import (ToolFormat, Tools, constraint, content_opening, described_tools, template_variables,
                         tool_format, with_calls_written, with_ids_it_takes, with_one_call_a_turn)

# For models without a chat template in their GGUF: a plain transcript the model can continue.
FALLBACK_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)

# The roles a conversation may hold. A template writes the role into the prompt as control-token text
# (`<|im_start|>{role}`), so any other string, such as "user<|im_end|>\n<|im_start|>system", could forge turns.
ROLES = ("system", "user", "assistant")
# llama-server's default batch, by whose shares it lays out an infill prompt (Prompts.infill)
INFILL_BATCH = 2048
# What a message may carry about tools beside its content (OpenAI's names), and an assistant's earlier
# thinking (which a reasoning model's template writes back, or drops): written into the prompt as text
TOOL_FIELDS = ("tool_calls", "tool_call_id", "name")
# what a chat template is given of the request itself, which no variable of a client's may stand for
# A template that reads a variable `thinking` as its switch (Kimi K3's, Granite 3.3's, DeepSeek V3.1's own): not a
# message's field of that name (gpt-oss's)
_THINKING_SWITCH = re.compile(r"\{%-?\s*(?:el)?if\b[^%]*?(?<![\w.'\"])thinking\b(?![\w'\"]|\s*[.\[(])")
RENDERED = frozenset(("messages", "tools", "add_generation_prompt", "bos_token", "eos_token"))
THINKING_FIELD = "reasoning_content"
# an earlier reply's thinking under each name templates read it by (gpt-oss's: thinking; Solar Open's: reasoning, vLLM's)
THINKING_NAMES = (THINKING_FIELD, "thinking", "reasoning")
# where a prompt shown as text holds an image (llama.cpp's default media marker, which llama-server's /apply-template
# writes too)
MEDIA_MARKER = "<__media__>"


def output_grammar(grammar: str | None = None, schema: dict | bool | None = None, any_object: bool = False,
                   regex: str | None = None, choices: list[str] | None = None) -> str | None:
    """The GBNF (llama.cpp's grammar format) an output must follow, for Sampling.grammar: a grammar as
    given, a JSON schema's (by llama.cpp's converter), any JSON object's, a regular expression's (matched whole),
    or one of the choices' (vLLM's structured outputs); None: free text."""
    if grammar is not None:
        return grammar
    if schema is not None:
        return from_json_schema(schema)
    if regex is not None:
        return from_regex(regex)
    if choices is not None:
        return from_choices(choices)
    return json_object() if any_object else None


def is_message(message) -> bool:
    """A message chat_tokens takes: one of ROLES and a content string."""
    return isinstance(message, dict) and message.get("role") in ROLES and isinstance(message.get("content"), str)


@dataclass(frozen=True)
class Prepared:
    """A request made ready to generate (Session.prepare): its prompt's tokens, the sampling it runs with
    (with the grammar that keeps tool calls well formed), its prediction's tokens, the form of its tool calls."""

    request: Request
    tokens: list[int]
    sampling: Sampling
    prediction: list[int] | None
    tool_format: ToolFormat | None
    reasoning_plan: reasoning.Plan | None = None  # how a reasoning model's reply splits into thinking and answer
    # the sampling once the reply's thinking is over (where a budget closed it): a tool call may begin anywhere
    answer_sampling: Sampling | None = None


def _arguments_as(call, text: bool):
    """An earlier call with its arguments as the template writes them: as the object they are where they come as
    JSON text (OpenAI's messages carry them so, as a ToolCall does; most templates write them with tojson, which
    wrote them as a quoted string), or as that text where the template joins them to its own (DeepSeek's).
    Arguments that are no JSON object stay as they came."""
    function = call.get("function") if isinstance(call, dict) else None
    arguments = function.get("arguments") if isinstance(function, dict) else None
    if text and isinstance(arguments, dict):
        return call | {"function": function | {"arguments": json.dumps(arguments, ensure_ascii=False)}}
    if text or not isinstance(arguments, str):
        return call
    try:
        arguments = json.loads(arguments)
    except ValueError:
        return call
    return call | {"function": function | {"arguments": arguments}} if isinstance(arguments, dict) else call


def _images_placed(message: dict) -> dict:
    """A message as its chat template renders it: its images (`images`: each an image file's bytes) each an
    IMAGE_MARKER in its content, those its content does not place before its text (as Ollama places them)."""
    images = message.get("images")
    if images is None:
        return message
    content = message.get("content") or ""
    placed = content.count(IMAGE_MARKER)
    if placed > len(images):
        raise InputError(f"a message places {placed} images but carries {len(images)}")
    return {key: value for key, value in message.items() if key != "images"} | {
        "content": IMAGE_MARKER * (len(images) - placed) + content}


def reply_opening(messages: list[dict], asked: Opening | None = None) -> Opening:
    """Where a conversation's reply begins: as asked, or as the conversation says, as llama-server reads it: where
    the last message is the assistant's (without calls), the reply goes on from it (CONTINUED), in its text (a
    prefill, as Anthropic's API takes one too) or, where it has only thinking, in its thinking; else a new turn.
    InputError where it is asked to go on from a message that is not the assistant's or that calls tools."""
    last = messages[-1] if messages else {}
    assistants = last.get("role") == "assistant" and not last.get("tool_calls")
    if asked in (Opening.CONTINUED, Opening.ANSWER, Opening.THINKING) and not assistants:
        raise InputError("a reply goes on only from the assistant's own message, last in the conversation and"
                         " calling no tools (continue_final_message): " + (
                             "that one calls tools" if last.get("role") == "assistant" else
                             f"the last message is the {last.get('role')}'s"))
    if asked not in (None, Opening.CONTINUED):
        return asked
    text, thought = last.get("content"), last.get(THINKING_FIELD)
    if assistants and isinstance(text, str) and text:
        return Opening.ANSWER
    if assistants and not text and isinstance(thought, str) and thought:
        return Opening.THINKING
    return Opening.ANSWER if asked else Opening.NEW


def _system_merged(messages: list[dict]) -> list[dict]:
    """A conversation for a template that writes no system message: the system text at the head of the next
    message's, as llama.cpp does (an editor's or agent's system prompt is not lost, nor the request refused)."""
    system, rest = messages[0], messages[1:]
    if not rest:
        return []
    return [rest[0] | {"content": f"{system.get('content') or ''}\n{rest[0].get('content') or ''}"}, *rest[1:]]


def _images_told(message: dict) -> dict:
    """A tool's result, for a model that reads no images, with a line in place of each of its images: an agent's
    tool that gives one (a screenshot, an image file read) would otherwise leave a conversation no request could go
    on from."""
    kept = {key: value for key, value in message.items() if key != "images"}
    note = "[an image, not shown: this model reads no images]"
    content = message.get("content") or ""
    lines = [note] * (len(message["images"]) - content.count(IMAGE_MARKER))  # (those the content does not place)
    return kept | {"content": "\n".join(lines + ([content.replace(IMAGE_MARKER, note)] if content else []))}


def _call_answered(arguments) -> list[dict]:
    """A probe conversation: a question, a call made with these arguments, its result (the call's id nine letters,
    as Mistral's templates insist on)."""
    call = {"id": "abcdefghi", "type": "function", "function": {"name": "probe", "arguments": arguments}}
    return [{"role": "user", "content": "?"}, {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "abcdefghi", "content": "!"}]


def _head(messages: list[dict]) -> int:
    """How many system messages a conversation opens with."""
    return next((i for i, m in enumerate(messages) if m.get("role") != "system"), len(messages))


def _head_merged(messages: list[dict]) -> list[dict]:
    """A conversation for a template that writes one system message at its head, not several: the system messages it
    opens with one, their texts a paragraph each (Codex opens with two developer messages)."""
    head = _head(messages)
    if head < 2 or not all(isinstance(m.get("content"), str) for m in messages[:head]):
        return messages
    return [{"role": "system", "content": "\n\n".join(m["content"] for m in messages[:head])}, *messages[head:]]


def _later_systems_as_users(messages: list[dict]) -> list[dict]:
    """A conversation for a template that writes no system message after its head: each later one the user's (an
    agent's instructions given as it goes on are read where they were given)."""
    head = _head(messages)
    return messages[:head] + [m | {"role": "user"} if m.get("role") == "system" else m for m in messages[head:]]


def _runs_merged(messages: list[dict]) -> list[dict]:
    """A conversation for a template that refuses two messages of one role in a row: each run of a user's (or an
    assistant's) plain messages one message, their texts a paragraph each (a client that sends its context and its
    question apart is answered, not refused)."""
    def plain(message: dict) -> bool:
        return message.get("role") in ("user", "assistant") and set(message) <= {"role", "content"} \
            and isinstance(message.get("content"), str)

    merged: list[dict] = []
    for message in messages:
        if merged and plain(message) and plain(merged[-1]) and merged[-1]["role"] == message["role"]:
            merged[-1] = merged[-1] | {"content": f"{merged[-1]['content']}\n\n{message['content']}"}
        else:
            merged.append(message)
    return merged


def _replies_between(messages: list[dict], reply: dict) -> list[dict]:
    """A conversation for a template that refuses a user's message right after a tool's result (Mistral's, as
    Mistral's API does; Anthropic's clients send one each turn, the user's text beside the results): an empty reply
    of the assistant's between them, as LiteLLM writes it for Mistral."""
    between: list[dict] = []
    for message in messages:
        if message.get("role") == "user" and between and between[-1].get("role") == "tool":
            between.append(reply)
        between.append(message)
    return between


def _thinking_in_blocks(message: dict) -> dict:
    """A message with earlier thinking, its content as blocks (the thinking, then the text), as templates that read
    it only so take it (Mistral's; as llama.cpp hands it to them)."""
    thought, content = message.get(THINKING_FIELD), message.get("content")
    if not isinstance(thought, str) or not isinstance(content, str):
        return message
    return message | {"content": [{"type": "thinking", "thinking": thought}] +
                      ([{"type": "text", "text": content}] if content else [])}


def _asked(thinking: Thinking) -> bool:
    """Whether a request says whether to think (a template with a default of its own is told only then)."""
    return thinking.think is not None or thinking.off


@dataclass(frozen=True)
class Switch:
    """A variable a reasoning model's template reads of how it is to think: its value for a request's thinking
    (None: the template's own default), and which templates read it (those that name it, unless told)."""

    name: str
    value: Callable[[Thinking], object]
    reads: Callable[[str, reasoning.Family], bool] | None = None  # (the template, its family)

    def read_by(self, template: str, family: reasoning.Family) -> bool:
        return self.reads(template, family) if self.reads else self.name in template


# The first switch of a name that a template reads decides it.
SWITCHES = (
    # (some templates close the block unless it is true: told always)
    Switch("enable_thinking", lambda thinking: not thinking.off),
    Switch("thinking", lambda thinking: not thinking.off if _asked(thinking) else None,
           lambda template, family: bool(_THINKING_SWITCH.search(template))),
    # Hy3's effort is its switch: no_think (its default), low or high
    Switch("reasoning_effort", lambda thinking: "no_think" if thinking.off else thinking.effort
           if thinking.effort in ("low", "high") else "high" if _asked(thinking) or thinking.effort else None,
           lambda template, family: "'no_think'" in template and "reasoning_effort" in template),
    # Solar Open's: minimal is no thinking
    Switch("reasoning_effort", lambda thinking: "minimal" if thinking.off else thinking.effort,
           lambda template, family: family is reasoning.SOLAR),
    Switch("reasoning_effort", lambda thinking: thinking.effort),
    Switch("thinking_effort", lambda thinking: thinking.effort),  # (Kimi K3's)
    Switch("reasoning_strength", lambda thinking: thinking.effort),  # (Muse Glimmer's)
    Switch("thinking_mode", lambda thinking: ("disabled" if thinking.off else "enabled")  # (MiniMax-M3's)
           if _asked(thinking) else None),
    Switch("thinking_budget", lambda thinking: 0 if thinking.off else thinking.budget),  # (Seed-OSS keeps count)
)


class Prompts:
    """The prompt work of a session: its target model and the context its prompts must fit."""

    def __init__(self, model: Model, n_ctx: int, template: str | None = None, vision: Vision | None = None):
        """template: the chat template to use in place of the model's own (--chat-template); vision: the model's
        multimodal projector, which makes the tokens of a message's images."""
        self.model, self.n_ctx, self.vision = model, n_ctx, vision
        self.template = template or model.chat_template() or FALLBACK_TEMPLATE
        self.family = reasoning.family(self.template)  # how its replies think
        self.thinks = self.family is not reasoning.NONE
        # the prompts of a request that offers tools, where the file carries a template for them (Hermes 2 Pro's and
        # 3's, Cohere's: their own is one without tools), as llama.cpp renders them
        tool_use = None if template else model.chat_template("tool_use")
        self.tool_use = Prompts(model, n_ctx, tool_use, vision) if tool_use else None

    @functools.cached_property
    def takes_system(self) -> bool:
        """Whether the template writes a system message (Gemma 2's refuses one, as do Mistral 7B's first), found as
        llama.cpp finds it: by writing one."""
        probe = "\u2063system\u2063"
        return probe in self._written([{"role": "system", "content": probe}, {"role": "user", "content": "?"}])

    @functools.cached_property
    def takes_runs(self) -> bool:
        """Whether the template writes two messages of one role in a row (Gemma's and Mistral's refuse them: "roles
        must alternate"), found by writing two."""
        return bool(self._written([{"role": "user", "content": "?"}, {"role": "user", "content": "?"}]))

    @functools.cached_property
    def takes_assistant_first(self) -> bool:
        """Whether the template writes a conversation that an assistant's message opens (a chat window's greeting;
        Gemma's and Mistral's want a user's first), found by writing one."""
        return bool(self._written([{"role": "assistant", "content": "?"}, {"role": "user", "content": "?"}]))

    @functools.cached_property
    def reply_after_results(self) -> dict | None:
        """The empty reply of the assistant's the template wants between a tool's result and a user's message (Mistral's
        refuse the user's right after a result); None where it takes it there, or refuses both. Found by writing
        both."""
        results = _call_answered("{}")
        if self._written([*results, {"role": "user", "content": "?"}]):
            return None
        # (Ministral 3's refuses an empty text, and takes an empty text block, which it writes as nothing alike)
        return next((reply for reply in ({"role": "assistant", "content": ""},
                                         {"role": "assistant", "content": [{"type": "text", "text": ""}]})
                     if self._written([*results, reply, {"role": "user", "content": "?"}])), None)

    @functools.cached_property
    def takes_systems(self) -> bool:
        """Whether the template writes each of two system messages at its head (Qwen 3.5's refuses a second, gpt-oss's,
        MiniMax's and SmolLM3's leave it out, DeepSeek R1's the first), found by writing two."""
        one, two = "\u2063one\u2063", "\u2063two\u2063"
        written = self._written([{"role": "system", "content": one}, {"role": "system", "content": two},
                                 {"role": "user", "content": "?"}])
        return one in written and two in written

    @functools.cached_property
    def takes_later_system(self) -> bool:
        """Whether the template writes a system message after the conversation began, and the one at its head too
        (most write one only at the head; DeepSeek R1's the last alone, moved there), found by writing both."""
        head, later = "\u2063head\u2063", "\u2063later\u2063"
        written = self._written([{"role": "system", "content": head}, {"role": "user", "content": "?"},
                                 {"role": "assistant", "content": "!"}, {"role": "system", "content": later},
                                 {"role": "user", "content": "?"}])
        return head in written and later in written

    @functools.cached_property
    def writes_replys_thinking(self) -> bool:
        """Whether the template writes the thinking of the reply it ends with (Qwen's do; DeepSeek R1's and Gemma 4's
        leave out every reply's), found by writing one."""
        needle = "\u2063thought\u2063"
        return needle in self._written([{"role": "user", "content": "?"}, {"role": "assistant", "content": "!",
                                         **dict.fromkeys(THINKING_NAMES, needle)}])

    def _written(self, messages: list[dict]) -> str:
        """A probe conversation as the template writes it; "" where it refuses it."""
        try:
            return render(self.template, messages, "", "")
        except InputError:
            return ""

    @functools.cached_property
    def arguments_as_text(self) -> bool:
        """Whether the template writes an earlier call's arguments only as the JSON text they are (DeepSeek's join
        them to strings, and fail on an object), not as an object (most write them with tojson), found as llama.cpp
        finds it: by writing a call both ways."""
        def written(arguments) -> str:
            return self._written(_call_answered(arguments))

        return '"needle"' not in written({"needle": 1}) and '"needle"' in written('{"needle": 1}')

    def prepare(self, request: Request) -> Prepared:
        """A request made ready to generate: its prompt as tokens (a conversation through the chat template,
        with the tools it may call), its prediction's tokens, and the sampling that keeps tool calls well
        formed. Raises, with nothing started, where the request cannot be generated (InputError,
        ContextOverflow, UsageError)."""
        if request.tools is not None and self.tool_use is not None:
            return self.tool_use.prepare(request)
        prediction = request.prediction
        if isinstance(prediction, str):
            prediction = self.prediction_tokens(prediction)
        sampling, tool_format, plan, answer_sampling = self.biased(request.sampling), None, None, None
        if request.tools is not None:
            sampling, tool_format = self.with_tools(sampling, request.tools)
        if request.messages is not None:
            thinking = request.thinking
            if self.thinks and sampling.grammar is not None and not sampling.grammar_triggers \
                    and (self.family.open or "<|channel|>") not in sampling.grammar:
                # a grammar that holds from the first token (a schema, tool_choice required) shapes the whole
                # reply: a reasoning model answers at once, its answer the grammar's, rather than think in it
                # (one that spells the thinking's own marker shapes the thinking too, and it thinks)
                thinking = replace(thinking, think=False, budget=None)
            opening = reply_opening(request.messages, request.opening)
            tokens = self.chat_tokens(request.messages, request.tools, thinking, request.template_variables, opening)
            if opening is Opening.NEW and (content := content_opening(self.template, request.tools)):
                # (its reply is content: no form to read)
                tokens, tool_format = tokens + self.model.spell(content), None
            tokens, plan = self.thinking_plan(tokens, thinking, opening in (Opening.ANSWER, Opening.NONE))
            if plan is not None:
                answer_sampling = sampling
                if request.tools is not None:  # (a client's own triggers count as written, as on llama-server)
                    sampling = replace(sampling, grammar_triggers=plan.past_thinking(sampling.grammar_triggers))
        elif request.suffix is not None:
            if not isinstance(request.prompt, str):
                raise InputError("a suffix goes with a text prompt: the text before the middle to fill in")
            tokens = self.fill_in(request.prompt, request.suffix)
        elif isinstance(request.prompt, str):
            tokens = self.tokenize(request.prompt, raw=True)
        else:
            tokens = self.token_ids(request.prompt)
        if request.continues:
            tokens = self.continued(request.continues, tokens)
        return Prepared(request, tokens, sampling, prediction or None, tool_format, plan, answer_sampling)

    def biased(self, sampling: Sampling) -> Sampling:
        """sampling with its logit bias in this model's token ids: a text's bias on each token of its spelling
        (as llama-server's), ids checked against the vocabulary."""
        if not sampling.logit_bias:
            return sampling
        pairs = [(token, bias) for text_or_id, bias in sampling.logit_bias
                 for token in (self._text_tokens(text_or_id) if isinstance(text_or_id, str) else [text_or_id])]
        beyond = [token for token, _ in pairs if token >= self.model.n_vocab]
        if beyond:
            raise UsageError(f"logit bias: token {beyond[0]} is not in this model's vocabulary of"
                             f" {self.model.n_vocab:,} (ids 0 to {self.model.n_vocab - 1})", setting="logit_bias")
        return replace(sampling, logit_bias=tuple(pairs))

    def thinking_plan(self, tokens: list[int], thinking: Thinking,
                      prefill: bool = False) -> tuple[list[int], reasoning.Plan | None]:
        """A conversation's prompt as a reasoning model is to read it, and how its reply is split: where thinking
        is turned off and the prompt opened the block (a template without a switch), it is closed in the prompt,
        as llama.cpp does; gpt-oss, which cannot be turned off, is given its final channel to answer in. A prefill's
        reply goes on inside the answer the prompt ends in: all answer, nothing added (as is the reply to a prompt
        that opens no turn)."""
        family = self.family
        if family is reasoning.NONE:
            if thinking.think and not thinking.if_able:
                raise InputError(f"{self.model.path.name} does not support thinking: its chat template writes no"
                                 " thinking block (ask without think)")
            return tokens, None
        if prefill:
            return tokens, reasoning.Plan(family, False, True, 0, tuple(self._markers(family.closing)))
        opened, answering = self._ends_inside_thinking(tokens), False
        if thinking.off and (opened or family.answer_now):
            tokens = tokens + self._markers(family.closing if opened else family.answer_now)
            opened, answering = False, True
        budget = 0 if thinking.off else thinking.budget
        return tokens, reasoning.Plan(family, opened, answering, budget, tuple(self._markers(family.closing)))

    def _ends_inside_thinking(self, tokens: list[int]) -> bool:
        """Whether a prompt ends inside a thinking block (its template's or a reply's): its last opening not closed
        after it (Seed-OSS's opening is followed by a budget's reflection; Apriel's is words)."""
        family = self.family
        tail = b"".join(self.model.special_piece(token) for token in tokens[-64:]).decode("utf-8", errors="replace")
        flat, opening, closing = ("".join(text.split()) for text in (tail, family.open + family.channel, family.close))
        at = flat.rfind(opening)
        return (family.format in (reasoning.ReasoningFormat.THINK, reasoning.ReasoningFormat.XTML) and at >= 0
                and closing not in flat[at:])

    def _thinking_resumed(self, tokens: list[int], thought: str) -> list[int]:
        """What goes on a prompt for its reply to go on in an earlier reply's thinking: the block's opening where the
        template did not write it, then the thinking so far, read as text (as llama-server writes it)."""
        family = self.family
        if family.format is not reasoning.ReasoningFormat.THINK:
            raise InputError(f"{self.model.path.name}: a reply goes on in its thinking only where the model thinks in"
                             " a block (<think> ... </think>); " + ("its chat template writes no thinking"
                                                                     if family is reasoning.NONE else
                                                                     f"this one thinks in {family.name}'s form"))
        opening = [] if self._ends_inside_thinking(tokens) else self._markers(family.open + family.channel)
        return opening + self._text_tokens(thought)

    def _markers(self, text: str) -> list[int]:
        """A template's own marker text as tokens (control tokens and all)."""
        return self.model.tokenize(text, add_special=False, parse_special=True)

    def template_variables(self, thinking: Thinking) -> dict:
        """What a reasoning model's template reads of how it is to think (llama.cpp's names): each switch its
        template reads (SWITCHES), where the request's thinking gives it a value."""
        variables, decided = {}, set()
        for switch in SWITCHES:
            if switch.name not in decided and switch.read_by(self.template, self.family):
                decided.add(switch.name)
                if (value := switch.value(thinking)) is not None:
                    variables[switch.name] = value
        return variables

    def tokenize(self, prompt: str, raw: bool) -> list[int]:
        """Prompt text to tokens, wrapped in the model's chat template unless raw."""
        if not prompt:
            raise InputError("the prompt is empty")
        if raw:  # written by hand, control tokens and all
            self.refuse_what_cannot_fit(len(prompt))
            self._refuse_by_its_head(prompt)
            return self.model.tokenize(prompt, add_special=True, parse_special=True)
        return self.chat_tokens([{"role": "user", "content": prompt}])

    def chat_tokens(self, messages: list[dict], tools: Tools | None = None, thinking: Thinking = Thinking(),
                    variables: dict | None = None, opening: Opening | None = None) -> list[int]:
        """A conversation, rendered with the model's chat template, ready for the assistant's turn, with
        the tools it may call and more variables of the template's (llama-server's chat_template_kwargs; the
        thinking's own come of thinking); the reply begins where opening says (reply_opening).

        Only the template's own text is read for control tokens: a message that spells one (a pasted
        `<|im_end|><|im_start|>system`) is tokenized as the text it is, so it cannot forge a turn. Tool
        definitions and earlier calls are written by the template as JSON: one that spells a control
        token is refused."""
        model = self.model
        template = self.template
        opening = reply_opening(messages, opening)
        thought = messages[-1].get(THINKING_FIELD) if messages else None
        if opening is Opening.THINKING or (opening is Opening.ANSWER and isinstance(thought, str) and thought
                                           and self.family.format is reasoning.ReasoningFormat.THINK
                                           and not self.writes_replys_thinking):
            # the reply so far written after its turn opened, as llama-server writes it
            tokens = self.chat_tokens(messages[:-1], tools, thinking, variables, Opening.NEW)
            tokens += self._thinking_resumed(tokens, str(thought or ""))
            if opening is Opening.ANSWER:
                tokens += self._markers(self.family.closing) + self._text_tokens(str(messages[-1].get("content") or ""))
            return tokens
        if self.vision is None:
            messages = [_images_told(m) if m.get("role") == "tool" and m.get("images") else m for m in messages]
        images = self._images_of(messages)
        messages = self._as_it_takes([_images_placed(m) for m in messages])
        messages = [m | dict.fromkeys(THINKING_NAMES, m[THINKING_FIELD])
                    if isinstance(m.get(THINKING_FIELD), str) else m for m in messages]
        messages = [m | {"tool_calls": [_arguments_as(call, self.arguments_as_text) for call in m["tool_calls"]]}
                    if isinstance(m.get("tool_calls"), list) else m for m in messages]
        bos, eos = model.special_text("bos"), model.special_text("eos")
        text = "".join(str(m.get("content") or "") for m in messages)
        self.refuse_what_cannot_fit(len(text), len(messages))
        self._refuse_by_its_head(text)

        def spells_control_tokens(text: str) -> bool:
            read = model.tokenize(text, False, True)
            return model.reads_control(read) and read != model.tokenize(text, False, False)

        literal = {i for i, m in enumerate(messages) if isinstance(m.get("content"), str)
                   and spells_control_tokens(m["content"])}
        messages = with_calls_written(messages, template)  # (after `literal`: their markers are control tokens)
        prefill = opening is Opening.ANSWER
        if self.family.earlier_in_blocks:  # (a message read as text keeps its content as it is, as does a prefill)
            messages = [_thinking_in_blocks(m) if i not in literal and not (prefill and i == len(messages) - 1) else m
                        for i, m in enumerate(messages)]
        fields = (*TOOL_FIELDS, THINKING_FIELD)
        about_tools = [list(tools.definitions) if tools else [],
                       [[m.get(key) for key in fields] for m in messages if any(key in m for key in fields)]]
        if any(about_tools) and spells_control_tokens(json.dumps(about_tools, ensure_ascii=False)):
            raise InputError("a tool definition, tool call or earlier thinking contains the text of a control token,"
                             " which the chat template would write as one")
        if described := described_tools(tool_format(template) if tools else None, template, tools):
            # (the template's own text, its markers control tokens: a system message of its own, after the client's)
            at = _head(messages)
            messages = [*messages[:at], {"role": "system", "content": described}, *messages[at:]]
            literal = {i + (i >= at) for i in literal}
        if variables:
            taken = RENDERED.intersection(variables)
            if taken:
                raise InputError(f"chat template variables: {', '.join(sorted(taken))} is the request's own to"
                                 " give, not a variable's")
            if spells_control_tokens(json.dumps(variables, ensure_ascii=False, default=str)):
                raise InputError("a chat template variable contains the text of a control token, which the chat"
                                 " template would write as one")
        thinks = self.template_variables(thinking) if self.family is not reasoning.NONE else {}
        variables = (variables or {}) | thinks | template_variables(template, tools)
        offered = list(tools.definitions) if tools else None
        # (a template that leaves the prefill's text out: the reply a turn of its own, as before)
        pieces = (prefill and render_pieces(template, messages, bos, eos, literal, offered, variables or None, True)
                  or render_pieces(template, messages, bos, eos, literal, offered, variables or None,
                                   generation_prompt=opening is not Opening.NONE))
        # Some templates write the BOS token themselves; adding another would change the prompt.
        add_bos = not (bos and "".join(text for text, _ in pieces).startswith(bos))
        tokens: list[int] = []
        images = iter(images)
        for number, (text, is_message) in enumerate(pieces):
            for part, text in enumerate(text.split(IMAGE_MARKER)):
                if part:
                    tokens += next(images, [])
                tokens += model.tokenize(text, add_special=add_bos and number == part == 0, parse_special=not is_message)
        if next(images, None) is not None:
            raise InputError("the chat template left out a message's images (a system message's?)")
        return tokens

    def _as_it_takes(self, messages: list[dict]) -> list[dict]:
        """The conversation as the template takes it, where it refuses what clients send (as llama.cpp adapts some):
        several system messages at its head, one later, an assistant's greeting first, a system message, two messages
        of one role in a row, a user's message right after a tool's result, several calls in one message, another
        model's call ids."""
        if not self.takes_systems:
            messages = _head_merged(messages)
        if not self.takes_later_system:
            messages = _later_systems_as_users(messages)
        opening = _head(messages)
        if opening < len(messages) and messages[opening].get("role") == "assistant" and not self.takes_assistant_first:
            # (an empty turn of the user's before the greeting, which is kept)
            messages = [*messages[:opening], {"role": "user", "content": ""}, *messages[opening:]]
        if messages and messages[0].get("role") == "system" and not self.takes_system:
            messages = _system_merged(messages)
        if not self.takes_runs:
            messages = _runs_merged(messages)
        if self.reply_after_results is not None:
            messages = _replies_between(messages, self.reply_after_results)
        return with_ids_it_takes(with_one_call_a_turn(messages, self.template), self.template)

    def _images_of(self, messages: list[dict]) -> list[list[int]]:
        """The tokens of the images the messages carry (their `images`), in order."""
        found = [image for message in messages for image in message.get("images") or ()]
        if found and self.vision is None:
            kind = "audio" if all(map(is_audio, found)) else "images"
            raise UsageError(f"this model reads no {kind}: load it with its multimodal projector (--mmproj FILE)",
                             setting="mmproj")
        return [self.vision.image_tokens(image, f"{'audio' if is_audio(image) else 'image'} {number}")
                for number, image in enumerate(found, 1)]

    def refuse_what_cannot_fit(self, characters: int, messages: int = 1) -> None:
        """Refuse by arithmetic alone what no tokenizing could fit into the context, before any time goes
        into rendering and tokenizing it (8 MB of spaces took up to a minute and 1.2 GB, 100,000 one-space
        messages four): more messages than the context has tokens (a chat template marks every message with at
        least one), or more characters than its tokens can stand for (a character is at least a byte).
        What passes costs at most the tokenizing of what a full context holds, less than reading it in.
        Cheap enough for a server's event loop once longest_token has been read."""
        n_ctx = self.n_ctx
        if messages > n_ctx:
            raise ContextOverflow(f"the conversation's {messages:,} messages cannot fit the context of {n_ctx} tokens"
                                  " (each takes at least one); raise --ctx-size or send fewer")
        if characters <= n_ctx:  # a token stands for a byte at least: no need to read the vocabulary
            return
        longest = self.model.longest_token
        if longest is not None and characters > n_ctx * longest:
            raise ContextOverflow(f"the prompt ({characters:,} characters) cannot fit the context of {n_ctx} tokens:"
                                  f" no token of this model stands for more than {longest} bytes, so at most"
                                  f" {n_ctx * longest:,} characters fit; raise --ctx-size or shorten the prompt")

    def _refuse_by_its_head(self, text: str) -> None:
        """Most text runs to several characters a token, far below the bound above: a piece of it
        already shows that it cannot fit."""
        n_ctx = self.n_ctx
        head = text[: n_ctx * 8]
        if len(head) < len(text) and len(self.model.tokenize(head, False, False)) >= n_ctx:
            raise ContextOverflow(f"the prompt ({len(text):,} characters) cannot fit the context of {n_ctx} tokens;"
                             " raise --ctx-size or shorten the prompt")

    def with_tools(self, sampling: Sampling, tools: Tools) -> tuple[Sampling, ToolFormat]:
        """Sampling under the grammar that keeps the model's calls to the tools well formed, and the form
        it writes them in; InputError where its template has no tools, or the answer is constrained
        already (a response format)."""
        form = tool_format(self.template)
        grammar, triggers = constraint(form, tools)
        if grammar is None:
            return sampling, form
        if sampling.grammar is not None:
            raise InputError("tools and a response format (or grammar) both constrain the answer; send one of them")
        return replace(sampling, grammar=grammar, grammar_triggers=triggers), form

    def embedding_inputs(self, inputs: list[str | list[int]], truncate: bool = False) -> list[list[int]]:
        """Each input to embed (text, or token ids) as the tokens the model reads: InputError, before any is
        embedded, for one that is empty or (unless truncate: its first n_ctx tokens, Ollama's default) longer than
        the context."""
        tokens = [self.model.tokenize(item, True, False) if isinstance(item, str) else self.token_ids(item)
                  for item in inputs]
        if truncate:
            tokens = [each[: self.n_ctx] for each in tokens]
        for number, each in enumerate(tokens, start=1):
            if not each:
                raise InputError(f"input {number} to embed is empty")
            if len(each) > self.n_ctx:
                raise InputError(f"input {number} to embed is {len(each):,} tokens but the context holds"
                                 f" {self.n_ctx:,}; raise --ctx-size or shorten it")
        return tokens

    def ranking_inputs(self, query: str, documents: list[str], most_document_tokens: int | None = None) -> list[list[int]]:
        """The query read with each document, as a reranker reads them (llama-server's pairs): its own "rerank"
        template filled in ({query}, {document}; Qwen3-Reranker's), else the two joined with the vocabulary's
        marks (Model.pair). most_document_tokens: each document's tokens past that many are left out (Cohere's
        max_tokens_per_doc). InputError, before any is scored, for a pair longer than the context."""
        model, template = self.model, self.model.chat_template("rerank")
        query_tokens = None if template else model.tokenize(query, False, False)
        pairs = []
        for number, document in enumerate(documents, start=1):
            # (a document read through the template is tokenized as a whole with it: on its own only to be cut)
            tokens = model.tokenize(document, False, False) if not template or most_document_tokens is not None else None
            if most_document_tokens is not None and len(tokens) > most_document_tokens:
                tokens = tokens[:most_document_tokens]
                document = model.spell_of(tokens).decode("utf-8", errors="ignore")
            pairs.append(model.tokenize(template.replace("{query}", query).replace("{document}", document), False, True)
                         if template else model.pair(query_tokens, tokens))
            if len(pairs[-1]) > self.n_ctx:
                raise InputError(f"document {number} is {len(pairs[-1]):,} tokens with the query, but the context"
                                 f" holds {self.n_ctx:,}; raise --ctx-size or shorten it")
        return pairs

    def prediction_tokens(self, text: str) -> list[int]:
        """Predicted text as the tokens the output would hold (no BOS, control tokens read as text), as far as
        an output could: a context's worth. Only that much of the text is read (8 MiB of code took 2.4 s of
        the worker's time to tokenize with Qwen2.5's tokenizer, for tokens no output can reach): a head that
        most text fills the context with, else as many characters as a context of the longest tokens holds."""
        n_ctx, tokenize = self.n_ctx, self.model.tokenize
        head = text[: n_ctx * 8]
        tokens = tokenize(head, False, False)
        if len(tokens) < n_ctx and len(head) < len(text):
            longest = self.model.longest_token
            tokens = tokenize(text[: n_ctx * longest] if longest else text, False, False)
        return tokens[:n_ctx]

    def infill(self, prefix: str, suffix: str, files: list[tuple[str, str]], typed: str, max_tokens: int | None) -> list[int]:
        """The prompt that asks a code model for what goes between prefix and suffix, laid out as llama-server's
        /infill lays it out (its tests' answers are then this model's too): other files' chunks (name, text)
        first, as the repository-level pattern has them where the model has its tokens, then the prefix's
        last tokens, what is typed on the cursor's line (typed), the suffix's first; each part cut to the
        share of a batch of INFILL_BATCH tokens llama-server gives it, the files to what the context leaves
        beside max_tokens (None: no limit) of answer."""
        fim = self._fim()
        tokens = self._text_tokens
        others = [fim["rep"], *tokens("myproject\n")] if "rep" in fim else []
        for name, text in files:
            others += [fim["sep"], *tokens(name + "\n")] if "sep" in fim else tokens("\n\n--- snippet ---\n\n")
            others += tokens(text)
        if "sep" in fim:
            others += [fim["sep"], *tokens("filename\n")]
        typed_tokens = self.model.tokenize(typed, add_special=False, parse_special=True) if typed else []
        before = tokens(prefix)[-(3 * (INFILL_BATCH // 4)):] if prefix else []
        after = tokens(suffix)[: max(0, INFILL_BATCH // 4 - (2 + len(typed_tokens)))]
        room = max(0, self.n_ctx - INFILL_BATCH + 2 * (1 if max_tokens is None else -max_tokens))
        others = others[len(others) - min(room, len(others)):]
        start = [self.model.bos] if self.model.bos is not None else []
        return [*others, *start, fim["pre"], *before, *typed_tokens, fim["suf"], *after, fim["mid"]]

    def fill_in(self, prefix: str, suffix: str) -> list[int]:
        """The prompt that asks a code model for what goes between prefix and suffix, as Ollama's templates lay
        it out for a request's `suffix` (prefix, suffix, middle: `<|fim_prefix|>{prompt}<|fim_suffix|>{suffix}
        <|fim_middle|>` for Qwen2.5-Coder); both read as plain text, as /infill reads its code (a control
        token's spelling in them stays text)."""
        fim = self._fim()
        start = [self.model.bos] if self.model.bos is not None else []
        return [*start, fim["pre"], *self._text_tokens(prefix), fim["suf"], *self._text_tokens(suffix), fim["mid"]]

    def _fim(self) -> dict[str, int]:
        """The model's fill-in-the-middle tokens; InputError where it lacks those a fill needs."""
        fim = self.model.fim
        missing = [name for name in ("pre", "suf", "mid") if name not in fim]
        if missing:
            raise InputError(f"{self.model.path.name} cannot fill in the middle: its vocabulary has no"
                             f" {', '.join(f'FIM_{name.upper()}' for name in missing)} token (code models such as"
                             " Qwen2.5-Coder have them)")
        return fim

    def _text_tokens(self, text: str) -> list[int]:
        return self.model.tokenize(text, add_special=False, parse_special=False) if text else []

    def prompt_tokens(self, prompt: str | list[dict] | list[int], raw: bool = False) -> list[int]:
        """A prompt as tokens: text (wrapped in the chat template unless raw), a conversation (messages
        with role and content), or token ids (checked against the vocabulary)."""
        if isinstance(prompt, str):
            return self.tokenize(prompt, raw)
        listed = isinstance(prompt, (list, tuple))
        if not listed or prompt and not (all(isinstance(message, dict) for message in prompt) or all(
                isinstance(token, int) and not isinstance(token, bool) for token in prompt)):
            got = "a list of those mixed or of others" if listed else type(prompt).__name__
            raise InputError(f"a prompt is a text, a list of messages (role and content) or a list of token ids, got {got}")
        if prompt and all(isinstance(message, dict) for message in prompt):
            return self.chat_tokens(prompt)
        return self.token_ids(prompt)

    def continued(self, earlier: list[int], tokens: list[int]) -> list[int]:
        """A prompt's tokens after an earlier exchange's: read on from it, without a second BOS."""
        if not all(map(self._readable, earlier)):
            raise InputError(f"the earlier exchange's token ids (Ollama's context) must be between 0 and"
                             f" {self.model.n_vocab - 1}, this model's vocabulary")
        return list(earlier) + (tokens[1:] if tokens[:1] == [self.model.bos] else tokens)

    def shown(self, tokens: list[int]) -> str:
        """A prompt's tokens as text, special tokens' own text included, each image MEDIA_MARKER."""
        return "".join(MEDIA_MARKER if image else self.model.spell_of(tokens[start:end], special=True).decode(
            "utf-8", errors="replace") for start, end, image in media_runs(tokens))

    def token_ids(self, tokens: list) -> list[int]:
        """A prompt given as token ids, once they are known to be this model's."""
        if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Sequence):  # (a text was "ids must be between")
            raise UsageError(f"token ids are a list of whole numbers (prompts.tokenize(text) makes them), got"
                             f" {tokens!r:.60}")
        if not tokens:
            raise InputError("the prompt is empty")
        if not all(map(self._readable, tokens)):
            raise InputError(f"the prompt's token ids must be between 0 and {self.model.n_vocab - 1}, this model's"
                             " vocabulary")
        return list(tokens)

    def _readable(self, token) -> bool:
        """A token id of this model's vocabulary, or a row of an image its projector has read (tokens handed back)."""
        return isinstance(token, int) and (0 <= token < self.model.n_vocab
                                           or self.vision is not None and self.vision.holds(token))

    def tokenize_with_images(self, text: str, images: list[bytes]) -> list[int]:
        """A prompt read as written (control tokens and all) with an image where it writes MEDIA_MARKER, one for each
        of images, in order (llama-server's /completion with multimodal_data)."""
        parts = text.split(MEDIA_MARKER)
        if len(parts) - 1 != len(images):
            raise InputError(f"the prompt places {len(parts) - 1} images ({MEDIA_MARKER}) but carries {len(images)}")
        self.refuse_what_cannot_fit(len(text))
        self._refuse_by_its_head(text)
        rows = self._images_of([{"images": images}])
        tokens: list[int] = []
        for number, part in enumerate(parts):
            tokens += (rows[number - 1] if number else []) + self.model.tokenize(part, add_special=number == 0,
                                                                                   parse_special=True)
        return tokens

