"""Reasoning: the thinking split from the answer as a reply streams, for each way a template writes it."""

import gc
import json
import urllib.error
import urllib.request
from pathlib import Path
from dataclasses import replace

import httpx2 as httpx
import ollama
import openai
import pytest

from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation, Thinking
from localspec.engine.grammar import Grammar
from localspec.request import Opening, Request
from localspec.scheduler import ENDED
from localspec.session import Session
from localspec.stats import record
from conftest import TARGET, TEMPLATES
from test_server import ServerProcess, drafting_server, serving
from tinymodels import write_tiny_model
from localspec.errors import InputError
from localspec.tool_calls import ToolCall, ToolFormat, Tools, ToolStream, UnfinishedCall, tool_format
from localspec.reasoning import (APRIEL, COMMAND_R7B, GEMMA4, GRANITE, HARMONY, HY3, KIMI_K3, MINIMAX_M3, MUSE,
                                 NONE, SEED, SOLAR, THINK, AddressedSplitter, ChannelSplitter, HarmonySplitter, Part,
                                 Piece, ThinkSplitter, XtmlSplitter, family, unread_thinking)


def joined(pieces: list[Piece]) -> dict[Part, str]:
    out: dict[Part, str] = {}
    for piece in pieces:
        out[piece.part] = out.get(piece.part, "") + piece.text
    return out


def split_at(splitter, chunks: list[tuple[str, bool]]) -> tuple[dict[Part, str], int]:
    """All pieces of a reply fed in these chunks, and the most text ever held back."""
    pieces, held = [], 0
    for text, special in chunks:
        pieces += splitter.feed(text, special)
        held = max(held, getattr(splitter, "held", 0))
    return joined(pieces + splitter.finish()), held


REPLY = "<think>\nthe user wants 2+2. that is 4.\n</think>\n\nIt is 4."


@pytest.mark.parametrize("cut", range(1, len(REPLY)))
def test_a_think_block_splits_the_same_at_every_boundary(cut):
    whole = {Part.THINKING: "the user wants 2+2. that is 4.\n", Part.ANSWER: "It is 4."}
    assert split_at(ThinkSplitter(), [(REPLY, False)])[0] == whole
    parts, held = split_at(ThinkSplitter(), [(REPLY[:cut], False), (REPLY[cut:], False)])
    assert parts == whole
    # one character at a time: nothing is held back beyond a marker's length, less one
    parts, held = split_at(ThinkSplitter(), [(c, False) for c in REPLY])
    assert parts == whole and held <= len(THINK.close) - 1


def test_markers_as_tokens_of_their_own_and_control_tokens():
    chunks = [(THINK.open, True), ("a", False), ("<|im_end|>", True), ("b", False), (THINK.close, True), ("c", False)]
    assert split_at(ThinkSplitter(), chunks)[0] == {Part.THINKING: "ab", Part.ANSWER: "c"}


def test_a_block_the_template_opened_and_a_reply_cut_off_inside_it():
    assert split_at(ThinkSplitter(opened=True), [("so 4.</think>4", False)])[0] == {
        Part.THINKING: "so 4.", Part.ANSWER: "4"}
    splitter = ThinkSplitter(opened=True)
    assert joined(splitter.feed("still thinking </thi")) == {Part.THINKING: "still thinking "}
    assert splitter.thinking and joined(splitter.finish()) == {Part.THINKING: "</thi"}


def test_no_block_is_all_answer_and_a_later_marker_is_text():
    assert split_at(ThinkSplitter(), [("  Hello <think>x</think>", False)])[0] == {
        Part.ANSWER: "  Hello <think>x</think>"}
    splitter = ThinkSplitter()
    assert splitter.feed("\n") == [] and not splitter.thinking  # white space: the block may still come
    assert joined(splitter.feed("<thi")) == {} and joined(splitter.feed("nk>x")) == {Part.THINKING: "x"}
    assert splitter.thinking
    # a reply of white space alone ends as it was
    assert joined(ThinkSplitter().feed("\n\n") + []) == {}


def test_an_empty_block_the_template_writes_when_thinking_is_off():
    assert split_at(ThinkSplitter(), [("<think>\n\n</think>\n\nHi", False)])[0] == {Part.ANSWER: "Hi"}


def test_gemma4s_thought_channel():
    chunks = [("<|channel>", True), ("thought\nhm, 4", False), ("<channel|>", True), ("Four.", False)]
    assert split_at(ThinkSplitter(markers=GEMMA4), chunks)[0] == {Part.THINKING: "hm, 4", Part.ANSWER: "Four."}


HARMONY_REPLY = [("<|channel|>", True), ("analysis", False), ("<|message|>", True), ("User asks 2+2.", False),
           ("<|end|>", True), ("<|start|>", True), ("assistant", False), ("<|channel|>", True), ("final", False),
           ("<|message|>", True), ("It is ", False), ("4.", False)]


HARMONY_TEXT = "<|channel|>analysis<|message|>User asks 2+2.<|end|><|start|>assistant<|channel|>final<|message|>It is 4."


def test_harmony_channels_split_into_thinking_and_answer():
    whole = {Part.THINKING: "User asks 2+2.", Part.ANSWER: "It is 4."}
    assert split_at(HarmonySplitter(), HARMONY_REPLY)[0] == whole
    # as llama.cpp shows them: <|channel|>, <|message|>, <|start|> as text, <|end|> a control token
    chunks = [(piece, piece == "<|end|>") for piece in HARMONY_TEXT.replace("<|end|>", "\0<|end|>\0").split("\0")]
    assert split_at(HarmonySplitter(), chunks)[0] == whole
    parts, held = split_at(HarmonySplitter(), [(c, False) for c in HARMONY_TEXT])
    assert parts == whole and held <= len("<|constrain|>") - 1
    assert split_at(HarmonySplitter(answering=True), [("Four.", False)])[0] == {Part.ANSWER: "Four."}


def test_harmony_tool_calls_reach_the_answer_as_calls_tool_calls_reads():
    splitter = HarmonySplitter()
    chunks = [("<|channel|>", True), ("commentary to=functions.get_weather ", False), ("<|constrain|>", True),
              ("json", False), ("<|message|>", True), ('{"city":', False), (' "paris"}', False)]
    pieces = [p for text, special in chunks for p in splitter.feed(text, special)] + splitter.finish()
    assert {p.name for p in pieces} == {"get_weather"}
    stream = ToolStream(ToolFormat.HARMONY)
    [call] = [c for c in stream.feed(joined(pieces)[Part.ANSWER]) + stream.end() if isinstance(c, ToolCall)]
    assert (call.name, call.argument_values) == ("get_weather", {"city": "paris"})
    # the recipient before the channel, as gpt-oss's template writes earlier calls; a call the next message ends
    splitter = HarmonySplitter()
    chunks = [(" to=functions.now", False), ("<|channel|>", True), ("commentary json", False), ("<|message|>", True),
              ("{}", False), ("<|end|>", True)]
    assert joined([p for t, s in chunks for p in splitter.feed(t, s)]) == {
        Part.ANSWER: '<tool_call>{"name": "now", "arguments": {}}</tool_call>'}
    assert tool_format((TEMPLATES / "gpt-oss.jinja").read_text()) is ToolFormat.HARMONY


def test_a_reply_that_ignores_harmony_is_answer():
    assert split_at(HarmonySplitter(), [("just text", False)])[0] == {Part.ANSWER: "just text"}


def test_apriels_steps_end_at_its_final_response_marker_a_control_token_or_text():
    # the template opened the steps; [BEGIN FINAL RESPONSE] is token 998 of its vocabulary, [END ...] 999 (shown
    # by neither: a control token's text reaches the splitter as a marker only)
    for close in (("[BEGIN FINAL RESPONSE]", True), ("[BEGIN FINAL RESPONSE]", False)):
        parts, _ = split_at(ThinkSplitter(opened=True, markers=APRIEL),
                            [("The user wants 4.\n", False), close, ("\nIt is 4.", False), ("[END FINAL RESPONSE]", True)])
        assert parts == {Part.THINKING: "The user wants 4.\n", Part.ANSWER: "It is 4."}, close


def test_command_r7bs_plan_is_thinking_and_its_response_markers_are_left_out():
    # every marker a control token of its vocabulary: the splitter sees their text as markers only
    parts, _ = split_at(ThinkSplitter(markers=COMMAND_R7B),
                        [("<|START_THINKING|>", True), ("I will look it up.", False), ("<|END_THINKING|>", True),
                         ("<|START_RESPONSE|>", True), ("It is sunny.", False), ("<|END_RESPONSE|>", True)])
    assert parts == {Part.THINKING: "I will look it up.", Part.ANSWER: "It is sunny."}
    # an answer without a plan, as it writes one where no tools are offered
    parts, _ = split_at(ThinkSplitter(markers=COMMAND_R7B), [("<|START_RESPONSE|>", True), ("Hi.", False)])
    assert parts == {Part.ANSWER: "Hi."}


# Replies of the families whose splitters are their own, after each family's prompt (their markers as text here)
K3_TOOLS = '<|open|>tools<|sep|><|open|>call tool="f" index="1"<|sep|><|close|>call<|sep|><|close|>tools<|sep|>'
SPLITS = {
    # Granite 3.3, asked to think: its answer between <response> and </response> after its <think> block
    "granite": (lambda: ThinkSplitter(markers=GRANITE),
                "<think>the user wants 4.</think>\n<response>It is 4 < 5.</response>", "It is 4 < 5.",
                len("</response>") - 1),
    # Solar Open, after `<|begin|>assistant`: the tool_calls message handed on as written
    "solar-open": (ChannelSplitter,
                   "<|think|>the user wants 4.<|end|><|begin|>assistant<|content|>It is 4 < 5.<|end|><|begin|>assistant"
                   "<|tool_calls|><|tool_call:begin|>a<|tool_call:name|>f<|tool_call:args|>{}<|tool_call:end|>",
                   "It is 4 < 5.<|tool_calls|><|tool_call:begin|>a<|tool_call:name|>f<|tool_call:args|>{}"
                   "<|tool_call:end|>", len("<|tool_calls|>") - 1),
    # Muse Glimmer, after `<|start|>assistant`: a message to a tool handed on as written, addresses left out
    "muse-glimmer": (AddressedSplitter,
                     " to=self<|message|>the user wants 4.<|eom|><|start|>assistant to=user<|message|>It is 4 < 5."
                     '<|eom|><|start|>assistant to=f<|message|><atem:function_calls>\n<atem:invoke name="f">\n'
                     "</atem:invoke>\n</atem:function_calls><|eot|>",
                     'It is 4 < 5.<atem:function_calls>\n<atem:invoke name="f">\n</atem:invoke>\n</atem:function_calls>',
                     len("<|start|>assistant to=user<|message|>")),
    # Kimi K3, after `<|open|>think<|sep|>`: the tools section handed on as written, the message's closing left out
    "kimi-k3": (lambda: XtmlSplitter(opened=True),
                "the user wants 4.<|close|>think<|sep|><|open|>response<|sep|>It is 4 < 5.<|close|>response<|sep|>"
                + K3_TOOLS + "<|close|>message<|sep|>", "It is 4 < 5." + K3_TOOLS,
                len('<|open|>call tool="f" index="1"<|sep|>')),
}


@pytest.mark.parametrize("name, cut", [(name, cut) for name, (_, reply, _, _) in SPLITS.items()
                                       for cut in range(1, len(reply))])
def test_each_familys_reply_splits_the_same_at_every_boundary(name, cut):
    """The thinking apart from the answer, the family's markers and headers left out (its calls handed on in the
    answer as written, for tool_calls.py), never more than a marker held back, wherever the reply is cut."""
    splitter, reply, answer, most_held = SPLITS[name]
    parts, held = split_at(splitter(), [(reply[:cut], False), (reply[cut:], False)])
    assert parts == {Part.THINKING: "the user wants 4.", Part.ANSWER: answer}
    assert held <= most_held


def test_a_solar_open_reply_that_names_no_channel_is_answer():
    assert split_at(ChannelSplitter(), [("Hi.", False)])[0] == {Part.ANSWER: "Hi."}
    long = "x" * 40 + "<|end|>"
    assert split_at(ChannelSplitter(), [(long, False)])[0] == {Part.ANSWER: "x" * 40}


def test_a_muse_glimmer_reply_that_addresses_no_one_or_is_addressed_by_the_prompt_is_answer():
    assert split_at(AddressedSplitter(), [("Hi.", False)])[0] == {Part.ANSWER: "Hi."}
    assert split_at(AddressedSplitter(answering=True), [("Hi.<|eot|>", False)])[0] == {Part.ANSWER: "Hi."}


def test_kimi_k3s_markers_as_control_tokens_and_a_reply_that_leaves_the_form():
    chunks = [("<|close|>", True), ("think", False), ("<|sep|>", True), ("<|open|>", True), ("response", False),
              ("<|sep|>", True), ("Hi.", False), ("<|end_of_msg|>", True)]
    assert split_at(XtmlSplitter(opened=True), chunks)[0] == {Part.ANSWER: "Hi."}
    # thinking off: the prompt opened the response; a section it does not know is text
    assert split_at(XtmlSplitter(answering=True), [("a <|open|>b<|sep|>c", False)])[0] == {Part.ANSWER: "a <|open|>b<|sep|>c"}
    # a marker's text too long for a section's name, or cut off at the end: text
    long = "<|open|>" + "x" * 300
    assert split_at(XtmlSplitter(answering=True), [(long, False)])[0] == {Part.ANSWER: long}
    assert split_at(XtmlSplitter(answering=True), [("a<|close|>resp", False)])[0] == {Part.ANSWER: "a<|close|>resp"}


def test_the_family_is_read_from_the_template():
    assert family("{{ '<think>' }}...{{ '</think>' }}") is THINK
    assert family("<|start|>{{ m }}<|channel|>final<|message|>") is HARMONY
    assert family("{{ '<|channel>thought\\n<channel|>' }}") is GEMMA4
    assert family((TEMPLATES / "seed-oss.jinja").read_text()) is SEED
    assert family((TEMPLATES / "apriel-1.6.jinja").read_text()) is APRIEL
    assert family((TEMPLATES / "command-r7b.jinja").read_text()) is COMMAND_R7B
    assert family((TEMPLATES / "kimi-k3.jinja").read_text()) is KIMI_K3
    assert family((TEMPLATES / "granite-3.3.jinja").read_text()) is GRANITE
    assert family((TEMPLATES / "minimax-m3.jinja").read_text()) is MINIMAX_M3
    assert family((TEMPLATES / "hy3.jinja").read_text()) is HY3
    assert family((TEMPLATES / "solar-open.jinja").read_text()) is SOLAR
    assert family((TEMPLATES / "muse-glimmer.jinja").read_text()) is MUSE
    assert family("{% for m in messages %}{{ m.content }}{% endfor %}") is NONE
    assert family(None) is NONE


# ---- on tiny GGUFs carrying each family's real chat template and special tokens


def reply(session, thinking=Thinking(), grammar=None, max_tokens=40, temperature=0.0, seed=0):
    request = Request(Sampling(temperature=temperature, seed=seed, grammar=grammar), Limits(max_tokens=max_tokens),
                      messages=[{"role": "user", "content": "think about it"}], thinking=thinking)
    return record(session.generate(request))


def opened(path, mode=DrafterKind.NGRAM):
    return Session(path, None, Runtime(ctx_size=1024, threads=2), Speculation(mode, draft_max=4))


THOUGHT = 'root ::= "<think>" [a-z ]{8,60} "</think>" [a-z ]{4,30}'


def test_a_think_block_the_model_opens_is_apart_and_drafting_changes_no_token(thinkers):
    with opened(thinkers["qwen3"]) as session:
        drafted = reply(session, grammar=THOUGHT)
        session.use(DrafterKind.PLAIN)
        plain = reply(session, grammar=THOUGHT)
    assert (drafted.reasoning, drafted.text) == (plain.reasoning, plain.text)
    assert drafted.reasoning and drafted.text and "<think>" not in drafted.text + drafted.reasoning
    parts = drafted.summary().parts
    assert parts["thinking"].tokens + parts["answer"].tokens == drafted.tokens and parts["answer"].tokens > 0
    assert sum(part.steps for part in parts.values()) == drafted.steps


def test_a_block_the_template_opens_and_a_reply_cut_off_inside_it(thinkers):
    for name in ("qwen3.5", "deepseek-r1"):
        with opened(thinkers[name]) as session:
            cut = reply(session, max_tokens=12)
        assert cut.finish_reason == "length" and cut.text == "" and cut.reasoning, name
        assert cut.summary().parts["thinking"].tokens == 12


def test_the_budget_closes_the_block_and_the_model_answers(thinkers):
    with opened(thinkers["deepseek-r1"]) as session:
        budgeted = reply(session, Thinking(budget=5), max_tokens=20)
        closing = session.prompts.model.tokenize("</think>", add_special=False, parse_special=True)
        # at T > 0 as well, and with the limit reached right at the closing
        sampled = reply(session, Thinking(budget=3), max_tokens=4, temperature=0.8, seed=1)
    parts = budgeted.summary().parts
    assert parts["thinking"].tokens == 5 + len(closing) and budgeted.text and budgeted.tokens == 20
    assert budgeted.finish_reason == "length" and "</think>" not in budgeted.text + budgeted.reasoning
    assert sampled.tokens == 4 and sampled.text == "" and sampled.finish_reason == "length"


def test_kimi_k3_thinks_in_its_think_section_and_answers_in_its_response(thinkers):
    """Kimi K3 (XTML): the prompt opens its think section; a budget closes it and opens the response for the model,
    whose text is then the answer, without the sections' names (words its vocabulary writes as text), and drafting
    changes no token; thinking off opens the response in the prompt."""
    grammar = 'root ::= [a-z ]{4,20} "<|close|>response<|sep|><|close|>message<|sep|>"'
    with opened(thinkers["kimi-k3"]) as session:
        budgeted = reply(session, Thinking(budget=5), grammar=None, max_tokens=24)
        off = reply(session, Thinking(think=False), grammar=grammar, max_tokens=90)
        session.use(DrafterKind.PLAIN)
        plain_off = reply(session, Thinking(think=False), grammar=grammar, max_tokens=90)
        closing = len(session.prompts.model.tokenize(KIMI_K3.closing, add_special=False, parse_special=True))
    assert budgeted.summary().parts["thinking"].tokens == 5 + closing and budgeted.reasoning
    assert "response" not in budgeted.reasoning and not budgeted.text.startswith("response")
    assert off.reasoning == "" and off.text and off.finish_reason == "stop", off.text
    assert "response" not in off.text and "message" not in off.text and "<|" not in off.text
    assert (off.text, off.tokens) == (plain_off.text, plain_off.tokens)


def test_a_template_switched_by_thinking_is_told_only_where_a_request_asks(thinkers):
    """Granite 3.3's switch is `thinking`, off unless given (Kimi K3's is on unless given): --think reached no such
    template before; it is told where a request asks, and left to its default where none does."""
    asked = {}
    with opened(thinkers["granite-3.3"]) as session:
        for think in (None, True, False):
            prepared = session.prepare(Request(messages=[{"role": "user", "content": "hi"}], thinking=Thinking(think)))
            # (the tiny tokenizer adds spaces)
            asked[think] = "".join(session.prompts.model.spell_of(prepared.tokens, special=True).decode().split())
    told = "".join("write your response between <response></response>".split())
    assert told not in asked[None] and told in asked[True] and told not in asked[False]
    with opened(thinkers["minimax-m3"]) as session:  # (enabled opens its block; disabled closes it)
        plans = [session.prepare(Request(messages=[{"role": "user", "content": "hi"}], thinking=Thinking(think)))
                 for think in (None, True, False)]
        tails = [session.prompts.model.spell_of(p.tokens[-8:], special=True).decode() for p in plans]
        budgeted = reply(session, Thinking(think=True, budget=3), max_tokens=12)
    assert budgeted.reasoning and budgeted.text and "mm:think" not in budgeted.text + budgeted.reasoning
    assert [plan.reasoning_plan.opened for plan in plans] == [False, True, False]
    with opened(thinkers["hy3"]) as session:  # (asked to think, or how hard: its effort, which opens its block)
        for thinking, effort in ((Thinking(), None), (Thinking(True), "high"), (Thinking(effort="low"), "low"),
                                 (Thinking(effort="medium"), "high"), (Thinking(False), "no_think")):
            assert session.prompts.template_variables(thinking).get("reasoning_effort") == effort
            prepared = session.prepare(Request(messages=[{"role": "user", "content": "hi"}], thinking=thinking))
            assert prepared.reasoning_plan.opened == (effort in ("low", "high"))
    assert "".join(tails[2].split()).endswith("</mm:think>") and not "".join(tails[0].split()).endswith("think>")


def test_solar_open_thinks_in_its_think_message_and_answers_in_its_content(thinkers):
    """Solar Open's messages: the model names each one's channel after the prompt's `<|begin|>assistant`; the
    reply's thinking and answer come apart without the messages' markers and roles (all in the answer before)."""
    grammar = 'root ::= "<|think|>" [a-z ]{8,30} "<|end|><|begin|>assistant<|content|>" [a-z ]{4,20}'
    with opened(thinkers["solar-open"]) as session:
        drafted = reply(session, grammar=grammar, max_tokens=160)
        session.use(DrafterKind.PLAIN)
        plain = reply(session, grammar=grammar, max_tokens=160)
    assert drafted.reasoning and drafted.text and drafted.finish_reason == "stop"
    assert "assistant" not in drafted.text and "<|" not in drafted.text + drafted.reasoning
    assert (drafted.reasoning, drafted.text) == (plain.reasoning, plain.text)


def test_solar_opens_earlier_thinking_within_the_turn_reaches_its_template(thinkers, tmp_path):
    """Solar Open's template reads an earlier turn's thinking only as `message.reasoning` (vLLM's name): given only as
    reasoning_content and thinking, its thinking before a call was dropped from the agent's next prompt. Given now,
    from llama-server's reasoning_content and from vLLM's `reasoning`."""
    call = {"id": "a1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "paris"}'}}
    running = ServerProcess(tmp_path, thinkers["solar-open"], "-c", "2048", "--alias", "tiny")
    try:
        for name in ("reasoning_content", "reasoning"):
            history = [{"role": "user", "content": "the weather in paris"},
                       {"role": "assistant", "content": "", name: "look it up first", "tool_calls": [call]},
                       {"role": "tool", "tool_call_id": "a1", "content": "sun"}]
            prompt = json.loads(urllib.request.urlopen(urllib.request.Request(
                running.base + "/apply-template", data=json.dumps({"messages": history}).encode(),
                headers={"Content-Type": "application/json"}), timeout=60).read())["prompt"]
            # (the tiny tokenizer's spaces left out)
            assert "<|begin|>assistant<|think|>lookitupfirst<|end|>" in "".join(prompt.split()), name
    finally:
        assert running.stop() == 0, running.log()


def test_a_template_that_tells_the_model_the_answers_form_is_given_it_by_each_api(thinkers, tmp_path):
    """Kimi K3's template (DeepSeek V4's, Solar Open's and Cohere's too) tells the model the form its answer must
    take, from a `response_format` variable, which no request gave: the model was held to a schema it was never
    shown. OpenAI's response_format, the Responses API's text.format and Ollama's format now reach it."""
    schema = {"type": "object", "properties": {"verdict": {"type": "boolean"}}, "required": ["verdict"],
              "additionalProperties": False}
    ask = [{"role": "user", "content": "is it"}]
    running = ServerProcess(tmp_path, thinkers["kimi-k3"], "-c", "4096", "--alias", "tiny")

    def squeezed(text: str) -> str:  # (the tiny tokenizer's spaces left out)
        return "".join(text.split())

    try:
        for form, told in (({"type": "json_schema", "json_schema": {"name": "v", "schema": schema}},
                            "response_format=json_schema"), ({"type": "json_object"}, "response_format=json_object")):
            prompt = httpx.post(running.base + "/apply-template", timeout=60,
                                json={"messages": ask, "response_format": form}).json()["prompt"]
            assert told in squeezed(prompt) and ('"verdict"' in prompt) == (form["type"] == "json_schema"), form
        assert "response_format" not in squeezed(httpx.post(running.base + "/apply-template", timeout=60,
                                                            json={"messages": ask}).json()["prompt"])
        rendered = httpx.post(running.base + "/api/chat", timeout=60, json={
            "model": "tiny", "messages": ask, "format": schema, "_debug_render_only": True}).json()
        assert '"verdict"' in rendered["debug_info"]["rendered_template"]
        client = running.client()
        formed, free = (client.responses.create(model="tiny", input="is it", max_output_tokens=8, **extra).usage
                        for extra in ({"text": {"format": {"type": "json_schema", "name": "v", "schema": schema}}}, {}))
        assert formed.input_tokens > free.input_tokens + 20  # (the schema, told)
    finally:
        assert running.stop() == 0, running.log()
    assert "Traceback" not in running.log()


def test_ministral_3_thinks_in_its_think_block_and_reads_earlier_thinking_as_a_block(thinkers):
    """Magistral's and Ministral 3 Reasoning's [THINK] ... [/THINK] (control tokens: its thinking ran into the answer,
    its markers left out, before): the reply's thinking and answer come apart and drafting changes no token; an
    earlier turn's thinking, which its template reads only as a content block of type thinking, goes back to it."""
    grammar = 'root ::= "[THINK]" [a-z ]{8,30} "[/THINK]" [a-z ]{4,20}'
    with opened(thinkers["ministral-3"]) as session:
        drafted = reply(session, grammar=grammar, max_tokens=120)
        session.use(DrafterKind.PLAIN)
        plain = reply(session, grammar=grammar, max_tokens=120)
        history = [{"role": "user", "content": "hi"},
                   {"role": "assistant", "content": "hello there", "reasoning_content": "greet them back"},
                   {"role": "user", "content": "again"}]
        prepared = session.prepare(Request(messages=history))
        prompt = session.prompts.model.spell_of(prepared.tokens, special=True).decode()
    assert drafted.reasoning and drafted.text and drafted.finish_reason == "stop"
    assert "THINK" not in drafted.text + drafted.reasoning
    assert (drafted.reasoning, drafted.text) == (plain.reasoning, plain.text)
    assert "[THINK]greetthemback[/THINK]hellothere" in "".join(prompt.split())  # (the tiny tokenizer's spaces)


@pytest.mark.parametrize("name", ["gpt-oss", "qwen3", "deepseek-r1", "muse-glimmer", "solar-open", "kimi-k3"])
def test_a_prefill_goes_on_inside_a_reasoning_models_answer(thinkers, name):
    """A prefill (the conversation's last message the assistant's) ends the prompt inside the answer its template
    writes: nothing is added after it (gpt-oss's final channel and Muse Glimmer's address were, thinking off under a
    grammar), and the reply is all answer (Solar Open's splitter, waiting for a channel, showed none of it)."""
    asked = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "the answer is"}]
    with opened(thinkers[name], DrafterKind.PLAIN) as session:
        request = Request(Sampling(temperature=0, grammar="root ::= [a-z ]{5,10}"), Limits(max_tokens=24), messages=asked)
        prompt = session.prompts.model.spell_of(session.prepare(request).tokens, special=True).decode()
        replied = record(session.generate(request))
    assert "".join(prompt.split()).endswith("theansweris")
    assert replied.text.strip() and replied.reasoning == "" and replied.finish_reason == "stop"


CUT_OFF = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "reasoning_content": "first i count"}]


@pytest.mark.parametrize("name", ["qwen3", "qwen3.5", "deepseek-r1", "gemma4"])
def test_a_reply_goes_on_in_the_thinking_of_an_assistants_message_that_has_only_thinking(thinkers, name):
    """A reply cut off while it thought, sent back to go on (llama-server's continue_final_message, as its web UI's
    Continue sends it): the assistant's message last with thinking alone was read as a finished turn and a new reply
    began. The prompt ends inside the thinking now, the block opened where the template does not open it, and the
    reply thinks on; thinking turned off closes it; asked to go on in the answer, the thinking is closed before it."""
    with opened(thinkers[name], DrafterKind.PLAIN) as session:
        def prompt(**asked) -> str:
            request = Request(Sampling(temperature=0), Limits(max_tokens=4), messages=CUT_OFF, **asked)
            return "".join(session.prompts.model.spell_of(session.prepare(request).tokens, special=True).decode().split())

        family = session.prompts.family
        resumed = prompt()
        replied = record(session.generate(Request(Sampling(temperature=0), Limits(max_tokens=4), messages=CUT_OFF)))
        closed = prompt(thinking=Thinking(think=False))
        answering = prompt(opening=Opening.ANSWER)
    assert resumed.endswith(family.open + family.channel + "firsticount"), resumed
    assert replied.reasoning and replied.text == "" and replied.finish_reason == "length"
    assert closed.endswith("firsticount" + family.close), closed
    # (written by the template where it writes a reply's thinking, Qwen's; else as llama-server writes it)
    assert "firsticount" in answering and answering.endswith(family.close), answering


def test_going_on_in_the_thinking_is_refused_where_it_cannot_be_written(thinkers, tiny):
    for path, why in ((thinkers["gpt-oss"], "thinks in harmony's form"), (tiny["target"], "writes no thinking")):
        with opened(path, DrafterKind.PLAIN) as session:
            with pytest.raises(InputError, match=why):
                session.prepare(Request(messages=CUT_OFF))
    with opened(thinkers["qwen3"], DrafterKind.PLAIN) as session:
        for messages, why in ((CUT_OFF[:1], "the last message is the user's"),
                              ([*CUT_OFF[:1], {"role": "assistant", "content": "", "tool_calls": [{
                                  "id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}],
                               "that one calls tools")):
            with pytest.raises(InputError, match=why):
                session.prepare(Request(messages=messages, opening=Opening.CONTINUED))


def test_add_generation_prompt_and_continue_final_message_are_read_as_llama_server_and_vllm_read_them(thinkers,
                                                                                                       tmp_path):
    """Both were passed over: a vLLM client's `add_generation_prompt: false, continue_final_message: true`, a
    continuation in the thinking (`"reasoning_content"`), a prompt left without the assistant's turn, a new turn
    after the assistant's message asked for; and both asked at once answered rather than refused."""
    running = ServerProcess(tmp_path, thinkers["qwen3"], "--temp", "0", "-c", "1024", "--alias", "tiny")
    said = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "the answer is",
                                                "reasoning_content": "first i count"}]

    def prompt(messages, **asked) -> str:
        answer = httpx.post(running.base + "/apply-template", json={"messages": messages, **asked}, timeout=60)
        assert answer.status_code == 200, answer.text
        return "".join(answer.json()["prompt"].split())

    try:
        vllms = prompt(said, add_generation_prompt=False, continue_final_message=True)
        assert vllms.endswith("<think>firsticount</think>theansweris"), vllms
        assert prompt(said, continue_final_message="reasoning_content").endswith("<think>firsticount"), vllms
        assert prompt(said, continue_final_message="content") == vllms
        assert prompt(said[:1], add_generation_prompt=False).endswith("hi<|im_end|>")
        assert prompt(said, add_generation_prompt=True).endswith("theansweris<|im_end|><|im_start|>assistant")
        local = running.client()
        thought_on = local.chat.completions.create(model="tiny", messages=said, max_tokens=4,
                                                   extra_body={"continue_final_message": "reasoning_content"})
        assert thought_on.choices[0].message.model_extra["reasoning_content"] and thought_on.usage.completion_tokens == 4
        for messages, asked, why in ((said, {"add_generation_prompt": True, "continue_final_message": True},
                                      "ask for one"),
                                     (said[:1], {"continue_final_message": True}, "the last message is the user's"),
                                     (said, {"continue_final_message": "thinking"}, "continue_final_message")):
            with pytest.raises(openai.BadRequestError, match=why):
                local.chat.completions.create(model="tiny", messages=messages, max_tokens=4, extra_body=asked)
    finally:
        assert running.stop() == 0, running.log()
    assert "Traceback" not in running.log()


def test_muse_glimmer_thinks_to_itself_and_answers_the_user(thinkers):
    """Muse Glimmer's messages: one to `self` is the thinking, one to `user` the answer, without their addresses and
    markers (all in the answer before); thinking off addresses the answer in the prompt."""
    grammar = ('root ::= " to=self<|message|>" [a-z ]{8,30} "<|eom|><|start|>assistant to=user<|message|>"'
               ' [a-z ]{4,20}')
    with opened(thinkers["muse-glimmer"]) as session:
        drafted = reply(session, grammar=grammar, max_tokens=160)
        off = reply(session, Thinking(think=False), max_tokens=8)
        session.use(DrafterKind.PLAIN)
        plain = reply(session, grammar=grammar, max_tokens=160)
    assert drafted.reasoning and drafted.text and drafted.finish_reason == "stop"
    assert "to=" not in drafted.text + drafted.reasoning and "<|" not in drafted.text + drafted.reasoning
    assert (drafted.reasoning, drafted.text) == (plain.reasoning, plain.text)
    assert off.reasoning == "" and off.text


def test_thinking_turned_off_by_the_template_or_in_the_prompt(thinkers):
    for name in ("qwen3.5", "deepseek-r1", "qwen3"):  # a switch in the template; none (closed in the prompt)
        with opened(thinkers[name]) as session:
            off = reply(session, Thinking(think=False), max_tokens=10)
        assert off.reasoning == "" and off.text and not off.summary().parts, name


HARMONY_GRAMMAR = ('root ::= "<|channel|>analysis<|message|>" [a-z ]{8,40} "<|end|><|start|>assistant<|channel|>final'
                   '<|message|>" [a-z ]{4,30}')


def test_gpt_oss_harmony_channels_and_thinking_turned_off(thinkers):
    with opened(thinkers["gpt-oss"]) as session:
        harmony = reply(session, grammar=HARMONY_GRAMMAR, max_tokens=80)
        off = reply(session, Thinking(think=False), max_tokens=10)
        low = session.prompts.chat_tokens([{"role": "user", "content": "x"}], thinking=Thinking(effort="low"))
        prompt = b"".join(session.prompts.model.special_piece(t) for t in low).decode(errors="replace")
    assert harmony.reasoning and harmony.text and "<|" not in harmony.text + harmony.reasoning
    assert off.reasoning == "" and off.text
    with opened(thinkers["gpt-oss"]) as session:  # the budget closes the analysis channel and opens the final one
        closing = session.prompts.model.tokenize(HARMONY.closing, add_special=False, parse_special=True)
        budgeted = reply(session, Thinking(budget=3), max_tokens=40)
    assert budgeted.summary().parts["thinking"].tokens == 3 + len(closing) and budgeted.text
    assert "Reasoning: low" in prompt


# ---- through the commands


def test_run_json_and_batch_records_carry_the_thinking_apart(localspec, thinkers, tiny, tmp_path):
    ran = localspec("run", thinkers["deepseek-r1"], "-p", "why", "-n", "16", "--reasoning-budget", "6", "--temp", "0",
                    "--json")
    assert ran.returncode == 0, ran.stderr
    out = json.loads(ran.stdout)
    assert out["reasoning"] and out["text"] and "</think>" not in out["text"]
    assert out["stats"]["parts"]["thinking"]["tokens"] == 7 and out["stats"]["parts"]["answer"]["tokens"] == 9
    off = json.loads(localspec("run", thinkers["deepseek-r1"], "-p", "why", "-n", "8", "--temp", "0", "--no-think", "--json").stdout)
    assert off["reasoning"] == "" and off["text"] and off["stats"]["parts"] == {}
    # a model that does not think has no reasoning to report
    assert "reasoning" not in json.loads(localspec("run", tiny["target"], "-p", "why", "-n", "4", "--json").stdout)
    # show says how a model thinks
    assert json.loads(localspec("show", thinkers["gpt-oss"], "--json").stdout)["thinking"] == "harmony"
    assert json.loads(localspec("show", tiny["target"], "--json").stdout)["thinking"] is None
    assert "yes: <think> blocks" in localspec("show", thinkers["qwen3"]).stdout.decode()
    items = tmp_path / "items.jsonl"
    items.write_text('{"id": 1, "prompt": "why"}\n')
    done = localspec("batch", thinkers["qwen3.5"], items, "-n", "6", "--temp", "0")
    [record] = [json.loads(line) for line in done.stdout.splitlines()]
    assert done.returncode == 0 and record["reasoning"] and record["text"] == "" and record["finish_reason"] == "length"


def test_run_on_a_pipe_writes_the_answer_to_stdout_and_the_thinking_to_stderr(localspec, thinkers):
    ran = localspec("run", thinkers["deepseek-r1"], "-p", "why", "-n", "12", "--reasoning-budget", "4", "--temp", "0")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() and b"</think>" not in ran.stdout
    thought = ran.stderr.split(b"\n")[0]
    assert thought and b"thinking 5 tokens" in ran.stderr


def test_ollamas_hidethinking_and_think_equals_spellings(localspec, thinkers):
    args = ("run", thinkers["deepseek-r1"], "-p", "why", "-n", "12", "--reasoning-budget", "4", "--temp", "0")
    shown, hidden = localspec(*args), localspec(*args, "--hidethinking")
    assert hidden.returncode == 0 and hidden.stdout == shown.stdout, hidden.stderr  # it thought as before
    thought = json.loads(localspec(*args, "--hidethinking", "--json").stdout)["reasoning"]  # --json still carries it
    assert thought.strip() and thought.encode() in shown.stderr and thought.encode() not in hidden.stderr
    assert b"thinking 5 tokens" in hidden.stderr
    off = json.loads(localspec("run", thinkers["deepseek-r1"], "-p", "why", "-n", "8", "--temp", "0", "--think=false", "--json").stdout)
    assert off["reasoning"] == "" and off["text"]  # as --no-think
    # llama-server's -rea/--reasoning off (an unknown option before)
    rea = json.loads(localspec("run", thinkers["deepseek-r1"], "-p", "why", "-n", "8", "--temp", "0", "-rea", "off", "--json").stdout)
    assert rea["reasoning"] == "" and rea["text"] and rea["stats"]["parts"] == {}
    effort = localspec("run", thinkers["gpt-oss"], "-p", "why", "-n", "4", "--think=low", "--json")
    assert effort.returncode == 0, effort.stderr


def test_chat_think_and_no_think(localspec, thinkers):
    chatted = localspec("chat", thinkers["qwen3.5"], "-n", "6", "--temp", "0",
                        stdin=b"hello\n/no-think\nhello again\n")
    assert chatted.returncode == 0, chatted.stderr
    first, said, second = chatted.stdout.decode().splitlines()[-3:]
    # all thinking (cut off at 6 tokens), then an answer without any
    assert first == "" and said == "thinking off from the next message" and second


# ---- serve, through the real clients


def r1_server(folder: Path, thinkers) -> ServerProcess:
    """DeepSeek-R1's template opens the block itself: every reply thinks until the budget closes it."""
    return ServerProcess(folder, thinkers["deepseek-r1"], "--temp", "0", "-c", "1024", "--alias", "r1", "-n", "14",
                         "--reasoning-budget", "5")


thinking_server = serving(lambda folder, request: r1_server(folder, request.getfixturevalue("thinkers")))


ASK = [{"role": "user", "content": "why"}]


def test_openai_reasoning_content_whole_and_streamed(thinking_server):
    client = thinking_server.client()
    whole = client.chat.completions.create(model="r1", messages=ASK)
    message = whole.choices[0].message
    thought = message.model_extra["reasoning_content"]
    assert thought and message.content and "</think>" not in message.content + thought
    # vLLM's, Ollama's and OpenRouter's name for it too: their clients read only that one (they showed no thinking)
    assert message.model_extra["reasoning"] == thought
    assert whole.usage.completion_tokens_details.reasoning_tokens == 6  # 5, and the closing </think>
    assert whole.model_extra["speculation"]["parts"]["thinking"]["tokens"] == 6
    chunks = list(client.chat.completions.create(model="r1", messages=ASK, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    thinking = [d.model_extra["reasoning_content"] for d in deltas if (d.model_extra or {}).get("reasoning_content")]
    assert "".join(thinking) == thought and "".join(d.content or "" for d in deltas) == message.content
    assert [d.model_extra["reasoning"] for d in deltas if (d.model_extra or {}).get("reasoning_content")] == thinking
    # as llama-server streams them: a thinking chunk carries no content
    assert all(d.content is None for d in deltas if (d.model_extra or {}).get("reasoning_content"))
    # vLLM's return_token_ids: the thinking's ids too (the closing the budget wrote among them), whole and streamed
    ids = client.chat.completions.create(model="r1", messages=ASK, extra_body={"return_token_ids": True})
    own = ids.choices[0].model_extra["token_ids"]
    assert ids.choices[0].message.content == message.content and len(own) == ids.usage.completion_tokens
    chunks = list(client.chat.completions.create(model="r1", messages=ASK, stream=True,
                                                 extra_body={"return_token_ids": True}))
    assert [i for c in chunks for choice in c.choices for i in choice.model_extra["token_ids"]] == own
    # left in the content; turned off; a budget of the request's own
    inline = client.chat.completions.create(model="r1", messages=ASK, extra_body={"reasoning_format": "none"})
    assert inline.choices[0].message.content == thought + message.content
    assert "reasoning_content" not in inline.choices[0].message.model_extra
    off = client.chat.completions.create(model="r1", messages=ASK, reasoning_effort="none")
    assert "reasoning_content" not in off.choices[0].message.model_extra and off.choices[0].message.content
    longer = client.chat.completions.create(model="r1", messages=ASK, extra_body={"reasoning_budget_tokens": 8})
    assert longer.usage.completion_tokens_details.reasoning_tokens == 9
    with pytest.raises(openai.BadRequestError, match="reasoning effort"):
        client.chat.completions.create(model="r1", messages=ASK, reasoning_effort="lots")


def test_ollama_thinking_whole_and_streamed(thinking_server):
    local = ollama.Client(host=thinking_server.base)
    whole = local.chat("r1", messages=ASK, think=True)
    assert whole.message.thinking and whole.message.content
    streamed = list(local.chat("r1", messages=ASK, think=True, stream=True))
    assert "".join(c.message.thinking or "" for c in streamed) == whole.message.thinking
    assert "".join(c.message.content for c in streamed) == whole.message.content
    assert all(c.message.content == "" for c in streamed if c.message.thinking)
    generated = local.generate("r1", prompt="why")
    assert generated.thinking and generated.response
    assert not local.chat("r1", messages=ASK, think=False).message.thinking
    assert "thinking" in local.show("r1").capabilities
    # earlier thinking goes back to the template (which drops it, as DeepSeek-R1's does)
    again = local.chat("r1", messages=[*ASK, {"role": "assistant", "content": "x", "thinking": "y"}, *ASK])
    assert again.message.content
    metrics = urllib.request.urlopen(thinking_server.base + "/metrics", timeout=30).read().decode()
    assert 'localspec:part_tokens_total{part="thinking"}' in metrics


def test_a_template_that_thinks_in_an_unknown_form_is_said_once_and_left_in_the_answer(tmp_path):
    template = "{% for m in messages %}{{ m.content }}{% endfor %}[THINK]"
    assert family(template) is NONE and unread_thinking(template) == "[THINK]"
    assert unread_thinking("{% for m in messages %}{{ m.content }}{% endfor %}") is None
    assert unread_thinking((TEMPLATES / "qwen3.jinja").read_text()) is None
    path = write_tiny_model(tmp_path / "magistral.gguf", replace(TARGET, chat_template=template))
    with opened(path) as session:
        assert any("does not read" in note for note in session.notes)
        assert reply(session, max_tokens=4).reasoning == "" and not session.prompts.thinks
        with pytest.raises(InputError, match="does not support thinking"):
            reply(session, Thinking(think=True))


def test_markers_in_a_users_message_do_not_split_the_reply(thinkers):
    with opened(thinkers["deepseek-r1"]) as session:
        request = Request(Sampling(temperature=0), Limits(max_tokens=6),
                          messages=[{"role": "user", "content": "</think> answer now <think>"}])
        cut = record(session.generate(request))
    assert cut.text == "" and cut.reasoning  # the reply still starts inside the block the template opened


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
# what gpt-oss writes to call a tool after thinking, held by a grammar so that the tiny model writes it
HARMONY_CALL = ('root ::= "<|channel|>analysis<|message|>" [a-z ]{4,20} "<|end|><|start|>assistant<|channel|>'
                'commentary to=functions.get_weather <|constrain|>json<|message|>{\\"city\\": \\"" [a-z]{2,8} "\\"}"'
                ' "<|call|>"')


def test_gpt_oss_calls_tools_as_openai_tool_calls(thinkers, tmp_path):
    running = ServerProcess(tmp_path, thinkers["gpt-oss"], "--temp", "0", "-c", "2048", "--alias", "oss", "-n", "400")
    try:
        answer = running.client().chat.completions.create(
            model="oss", messages=ASK, tools=[WEATHER], extra_body={"grammar": HARMONY_CALL})
        choice = answer.choices[0]
        [call] = choice.message.tool_calls
        assert choice.finish_reason == "tool_calls" and call.function.name == "get_weather"
        assert set(json.loads(call.function.arguments)) == {"city"} and choice.message.model_extra["reasoning_content"]
        assert not choice.message.content
    finally:
        assert running.stop() == 0, running.log()


def test_a_harmony_call_cut_off_by_a_limit_stays_unfinished():
    splitter = HarmonySplitter()
    pieces = [p for t in ("<|channel|>commentary to=functions.f<|message|>", '{"a": ') for p in splitter.feed(t)]
    stream = ToolStream(ToolFormat.HARMONY)
    stream.feed(joined(pieces + splitter.finish(stopped=False))[Part.ANSWER])
    with pytest.raises(UnfinishedCall):
        stream.end()


def test_a_reply_stopped_inside_its_thinking_joins_the_chat_as_far_as_it_got(thinkers):
    with opened(thinkers["qwen3.5"]) as session:
        chat = session.chat(limits=Limits(max_tokens=30), sampling=Sampling(temperature=0))
        stream = chat.stream("think")
        for event in stream:  # as Ctrl-C does: the caller stops the stream
            if getattr(event, "thought", ""):
                break
        stream.close()
        stopped = chat.messages[-1]
        assert stopped["role"] == "assistant" and stopped["content"] == "" and stopped["reasoning_content"]
        assert chat.recorder.finish_reason == "interrupted"
        # the next turn renders that history (the template drops earlier thinking) and goes on thinking
        again = chat.send("again", max_tokens=4)
        assert again.finish_reason == "length" and again.reasoning and again.text == ""


def test_a_generation_dropped_unfinished_gives_its_sequence_back_at_once(thinkers):
    """A library user who stops reading and drops the generator: the next one may start at once. (This template's
    probes fail inside jinja, whose error once held the generation in a cycle until the collector ran: off here.)"""
    request = Request(Sampling(temperature=0), Limits(max_tokens=8), messages=[{"role": "user", "content": "think"}])
    with opened(thinkers["qwen3.5"]) as session:
        gc.disable()
        try:
            events = session.generate(request)
            next(events)
            del events
            assert record(session.generate(request)).finish_reason == "length"
        finally:
            gc.enable()


@pytest.mark.parametrize(("name", "on", "off"), [
    # (how the prompt leaves the reply with thinking on, and off): opened, answering, what the template wrote
    ("qwen3", (False, False, ""), (False, False, "<think>\n\n</think>")),
    ("qwen3.5", (True, False, "<think>\n"), (False, False, "<think>\n\n</think>")),
    ("deepseek-r1", (True, False, "<think>\n"), (False, True, "<think>\n</think>")),
    ("glm4.5", (False, False, ""), (False, False, "<think></think>")),
    ("gemma4", (False, False, "<|think|>"), (False, False, "<|channel>thought\n<channel|>")),
    ("gpt-oss", (False, False, "Reasoning: medium"), (False, True, "<|channel|>final<|message|>")),
    # Seed-OSS: no switch, a budget (0 off) its template tells the model of, opening the block with a reflection
    ("seed-oss", (False, False, ""), (False, True, "thinking budget is 0")),
    # Apriel: no switch; the template opens the thinking with words, closed in the prompt for thinking off
    ("apriel", (True, False, "Here are my reasoning steps:"), (False, True, "[BEGIN FINAL RESPONSE]")),
    # Nemotron Nano v2: its switch is /no_think in a message; the block it opens is closed in the prompt
    ("nemotron-nano-v2", (True, False, "<think>"), (False, True, "<think></think>")),
    # Command R7B: no switch and no block opened; its plan, where it writes one, is cut at once for thinking off
    ("command-r7b", (False, False, ""), (False, False, "")),
    # Kimi K3: its switch `thinking` (on unless told); the prompt opens its think section, or its response
    ("kimi-k3", (True, False, "<|open|>think<|sep|>"), (False, False, "<|open|>response<|sep|>")),
    # MiniMax-M3: its switch `thinking_mode` (adaptive unless told: the model decides); disabled closes the block
    ("minimax-m3", (False, False, "Current thinking mode: adaptive"), (False, False, "disabled.")),
    # Muse Glimmer: no switch (it always thinks); thinking off addresses the answer to the user in the prompt
    ("muse-glimmer", (False, False, "Reasoning strength: high."), (False, True, "to=user<|message|>")),
    # Solar Open: thinking (reasoning_effort high) unless told; minimal writes an empty think message before the reply
    ("solar-open", (False, False, ""), (False, False, "<|begin|>assistant<|think|><|end|><|begin|>assistant")),
    # Ministral 3 Reasoning: no switch (its default system prompt asks for thinking); a block it opens is cut at once
    # for thinking off
    ("ministral-3", (False, False, "[SYSTEM_PROMPT]# HOW YOU SHOULD THINK"), (False, False, "[/SYSTEM_PROMPT]")),
    # Hy3: its switch its reasoning_effort, no_think unless told: its template closes the block either way
    ("hy3", (False, False, "<think:opensource></think:opensource>"),
     (False, False, "<think:opensource></think:opensource>")),
])
def test_each_familys_template_is_told_whether_to_think(thinkers, name, on, off):
    with opened(thinkers[name]) as session:
        for thinking, (is_open, answering, written) in ((Thinking(), on), (Thinking(think=False), off)):
            prepared = session.prepare(Request(messages=[{"role": "user", "content": "hi"}], thinking=thinking))
            plan = prepared.reasoning_plan
            prompt = b"".join(session.prompts.model.special_piece(t) for t in prepared.tokens).decode(errors="replace")
            shown = "".join(written.split()) in "".join(prompt.split())  # (the tiny tokenizer adds spaces)
            assert (plan.opened, plan.answering, shown) == (is_open, answering, True), (name, thinking)
            assert plan.budget == (0 if thinking.off else None)


def test_enable_thinking_false_in_the_command_lines_template_kwargs_turns_thinking_off(thinkers, tmp_path):
    """`llama-server --chat-template-kwargs '{"enable_thinking": false}'`, as guides turn Qwen3's thinking off: the
    variable was handed on and then overridden by the thinking's own (on), so Qwen3 went on thinking."""
    server = ServerProcess(tmp_path, thinkers["qwen3"], "-c", "1024", "--alias", "tiny", "--chat-template-kwargs",
                           '{"enable_thinking": false}')
    try:
        reply = server.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                        max_tokens=8, temperature=0)
        assert reply.choices[0].message.model_extra.get("reasoning_content") is None
        prompt = urllib.request.urlopen(urllib.request.Request(
            server.base + "/apply-template", data=json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode(),
            headers={"Content-Type": "application/json"}), timeout=60).read()
        # (the template's empty block, thinking off; the tiny vocabulary shows a space after each marker)
        assert "".join(json.loads(prompt)["prompt"].split()).endswith("<think></think>")
        # a request's enable_thinking true turns it back on, as llama-server's does (it was taken and left alone)
        asked = urllib.request.urlopen(urllib.request.Request(
            server.base + "/apply-template", data=json.dumps({"messages": [{"role": "user", "content": "hi"}],
                                                              "chat_template_kwargs": {"enable_thinking": True}}).encode(),
            headers={"Content-Type": "application/json"}), timeout=60).read()
        assert "".join(json.loads(asked)["prompt"].split()).endswith("<|im_start|>assistant")
        # Qwen's own API spells the switch beside the messages (its clients send it so): passed over before
        qwens = httpx.post(server.base + "/apply-template", json={"messages": [{"role": "user", "content": "hi"}],
                                                                 "enable_thinking": True}, timeout=60)
        assert "".join(qwens.json()["prompt"].split()).endswith("<|im_start|>assistant")
        both = httpx.post(server.base + "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "enable_thinking": True,
            "chat_template_kwargs": {"enable_thinking": False}}, timeout=60)
        assert both.status_code == 400 and "say two things" in both.json()["error"]["message"]
    finally:
        assert server.stop() == 0, server.log()


@pytest.fixture(scope="module")
def plain_server(tiny, tmp_path_factory):
    """A model that does not think."""
    running = drafting_server(tmp_path_factory.mktemp("plain"), tiny)
    yield running
    assert running.stop() == 0, running.log()


def test_enable_thinking_true_passes_for_a_model_that_does_not_think_as_on_llama_server(plain_server):
    answer = plain_server.client().chat.completions.create(
        model="tiny", messages=ASK, max_tokens=4, extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    assert answer.choices[0].message.content and "reasoning_content" not in answer.choices[0].message.model_extra
    assert answer.usage.completion_tokens_details.reasoning_tokens == 0


OPENAI_WRONG = [("reasoning_effort", 5), ("reasoning_effort", "lots"), ("reasoning_effort", []),
                ("chat_template_kwargs", "x"), ("chat_template_kwargs", {"enable_thinking": "yes"}),
                ("chat_template_kwargs", {"reasoning_effort": 3}), ("thinking_budget_tokens", "5"),
                ("thinking_budget_tokens", -7), ("thinking_budget_tokens", 1.5), ("reasoning_budget_tokens", True),
                ("reasoning_format", 3), ("reasoning_format", "weird"), ("speculative", "off"),
                ("speculative", {"mode": 1}), ("speculative", {"draft": "x"}), ("speculative", {"draft_max": -1}),
                ("speculative", {"draft_max": 2.5}), ("messages", [{"role": "assistant", "content": "a",
                                                                    "reasoning_content": 5}, *ASK])]
OLLAMA_WRONG = [("think", 5), ("think", "lots"), ("think", []), ("speculative", "off"),
                ("options", {"draft_num_predict": -1}), ("options", {"draft_num_predict": "3"}),
                ("messages", [{"role": "assistant", "content": "a", "thinking": 5}, *ASK])]


def test_every_new_field_of_the_wrong_kind_is_a_400_in_each_protocols_shape(thinking_server):
    def post(path: str, body: dict) -> tuple[int, dict]:
        sent = urllib.request.Request(thinking_server.base + path, data=json.dumps(body).encode(),
                                      headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(sent, timeout=60) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    for field, value in OPENAI_WRONG:
        status, body = post("/v1/chat/completions", {"model": "r1", "messages": ASK, field: value})
        assert status == 400 and body["error"]["message"], (field, value, status, body)
    for field, value in OLLAMA_WRONG:
        status, body = post("/api/chat", {"model": "r1", "messages": ASK, "stream": False, field: value})
        assert status == 400 and isinstance(body["error"], str), (field, value, status, body)


def test_the_budget_closes_the_block_on_parallel_sequences_each_as_alone(thinkers):
    asks = [Request(Sampling(temperature=0), Limits(max_tokens=16), messages=[{"role": "user", "content": text}],
                    thinking=Thinking(budget=budget)) for text, budget in (("why", 4), ("how so", 6))]
    with opened(thinkers["deepseek-r1"]) as alone:
        expected = [(r.reasoning, r.text) for r in (record(alone.generate(ask)) for ask in asks)]
    with Session(thinkers["deepseek-r1"], None, Runtime(ctx_size=1024, threads=2, parallel=2),
                 Speculation(DrafterKind.NGRAM, draft_max=4)) as session:
        scheduler, ended = session.scheduler(), {}
        started = [scheduler.add(ask) for ask in asks]
        while scheduler:
            for running, item in scheduler.step():
                assert not isinstance(item, BaseException), item
                if item is ENDED:
                    ended[running.sequence] = running.recorder
    assert [(ended[r.sequence].reasoning, ended[r.sequence].text) for r in started] == expected
    assert all(text for _, text in expected)


def test_a_grammar_over_the_whole_reply_has_a_reasoning_model_answer_in_it_at_once(thinkers):
    schema = 'root ::= "{" [a-z]{2,6} "}"'
    for name in ("deepseek-r1", "qwen3.5", "gpt-oss"):  # opened by the template, or harmony
        with opened(thinkers[name]) as session:
            shaped = reply(session, Thinking(think=True), grammar=schema, max_tokens=40)
        assert shaped.reasoning == "" and shaped.text.startswith("{") and shaped.text.endswith("}"), (name, shaped.text)


@pytest.mark.parametrize("name, opening", [("qwen3", "<tool_call>"), ("qwen3.5", "<tool_call>"),
                                           ("gemma4", "<|tool_call>"), ("minimax-m2", "<minimax:tool_call>"),
                                           ("kimi-k2", "<|tool_calls_section_begin|>"),
                                           ("seed-oss", "<seed:tool_call>"), ("apriel", "<tool_calls>"),
                                           ("nemotron-nano-v2", "<TOOLCALL>"), ("command-r7b", "<|START_ACTION|>")])
def test_a_call_spelled_in_the_thinking_sets_off_no_tool_grammar_and_one_past_it_does(thinkers, name, opening):
    """Thinking that plans a call spells its opening: set off there, the lazy grammar refused the thinking's
    next words (and held it to a call that ended the reply inside the block, which nothing read as a call)."""
    with opened(thinkers[name]) as session:
        prepared = session.prepare(Request(Sampling(temperature=0), Limits(max_tokens=40), tools=Tools((WEATHER,)),
                                           messages=[{"role": "user", "content": "the weather in paris?"}]))
        plan, model = prepared.reasoning_plan, session.prompts.model
        begun = "" if plan.opened else plan.family.open + plan.family.channel
        thinking = f"{begun}\nI will write {opening} and then the city, or"
        with Grammar(model, prepared.sampling.grammar, prepared.sampling.grammar_triggers) as grammar:
            for token in model.tokenize(thinking, add_special=False, parse_special=True):
                assert grammar.admits(token), (name, model.piece(token))
                grammar.accept(token)
            assert grammar.awaiting
            for token in model.tokenize(f" ask.{plan.family.close}\n\n{opening}", add_special=False,
                                        parse_special=True):
                grammar.accept(token)
            assert not grammar.awaiting, name  # past the thinking, the call is held to the tools
        # where a budget closed the thinking, the answer goes on as a generation of its own: a call may open at once
        answering = prepared.answer_sampling
        with Grammar(model, answering.grammar, answering.grammar_triggers) as grammar:
            for token in model.tokenize(opening, add_special=False, parse_special=True):
                grammar.accept(token)
            assert not grammar.awaiting, name
