"""Tool calls: the forms model families write them in, read whole or as they stream; the grammar that
keeps every call well formed under speculation; serve's OpenAI and Ollama answers with them, through
the real clients."""

import json
import re
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import httpx2 as httpx
import lmstudio as lms
import numpy as np
import ollama
import openai
import pytest

import localspec.engine.speculative as speculative
from localspec.config import Limits, Sampling, Speculation
from localspec.engine.drafters import ModelDrafter, NoDrafter
from localspec.chat_template import render
from localspec.engine.grammar import Grammar
from localspec.engine.model import Model
from localspec.prompts import Prompts
from localspec.engine.sampling import Dist
from localspec.errors import InputError
from localspec.stats import record
from localspec.events import Done, Token
from localspec.tool_calls import (ToolFormat, Tools, ToolStream, UnfinishedCall, arguments_schema, constraint, shown,
                                  tool_format)

from test_server import ServerProcess, raw_socket, serving
from tinymodels import TinySpec, write_tiny_model

# Templates in each family's manner, made for these tests (the markers are what tool_format reads).
HERMES = ("{% if tools %}system: call a tool as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>:"
          "{% for t in tools %} {{ t | tojson }}{% endfor %}\n{% endif %}"
          "{% for m in messages %}{{ m.role }}: {{ m.content }}"
          "{% for c in m.tool_calls or [] %}<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\":"
          " {{ c.function.arguments | tojson }}}</tool_call>{% endfor %}\n{% endfor %}"
          "{% if add_generation_prompt %}assistant:{% endif %}")
LLAMA3 = ("{% if tools %}Environment: ipython\nrespond with {\"name\": function name, \"parameters\": arguments}"
          "{% for t in tools %} {{ t | tojson }}{% endfor %}\n{% endif %}"
          "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:")
MISTRAL = ("{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
           "{% for m in messages %}{{ m.content }}{% if m.tool_calls %}[TOOL_CALLS]{{ m.tool_calls | tojson }}"
           "{% endif %}{% endfor %}")
REAL = Path(__file__).parent / "templates"  # the families' own templates
TEMPLATES = {ToolFormat.HERMES: HERMES, ToolFormat.LLAMA3: LLAMA3, ToolFormat.MISTRAL: MISTRAL,
             ToolFormat.HARMONY: (REAL / "gpt-oss.jinja").read_text(), ToolFormat.XML: (REAL / "qwen3.5.jinja").read_text(),
             ToolFormat.GLM: (REAL / "glm4.5.jinja").read_text(), ToolFormat.GEMMA4: (REAL / "gemma4.jinja").read_text(),
             ToolFormat.MISTRAL_ARGS: (REAL / "mistral-small-3.2.jinja").read_text(),
             ToolFormat.LFM2: (REAL / "lfm2.jinja").read_text(),
             ToolFormat.MINIMAX: (REAL / "minimax-m2.jinja").read_text(),
             ToolFormat.KIMI: (REAL / "kimi-k2-thinking.jinja").read_text(),
             ToolFormat.SEED: (REAL / "seed-oss.jinja").read_text(),
             ToolFormat.APRIEL: (REAL / "apriel-1.6.jinja").read_text(),
             ToolFormat.NEMOTRON: (REAL / "nemotron-nano-v2.jinja").read_text(),
             ToolFormat.COMMAND_R7B: (REAL / "command-r7b.jinja").read_text(),
             ToolFormat.DSML_FUNCTIONS: (REAL / "deepseek-v3.2.jinja").read_text(),
             ToolFormat.DSML: (REAL / "deepseek-v4.jinja").read_text(),
             ToolFormat.MINICPM5: (REAL / "minicpm5.jinja").read_text(),
             ToolFormat.APERTUS: (REAL / "apertus.jinja").read_text(),
             ToolFormat.GRANITE: (REAL / "granite-3.3.jinja").read_text(),
             ToolFormat.GIGACHAT3: (REAL / "gigachat3.jinja").read_text(),
             ToolFormat.GIGACHAT31: (REAL / "gigachat3.1.jinja").read_text(),
             ToolFormat.FIREFUNCTION: (REAL / "firefunction-v2.jinja").read_text(),
             ToolFormat.FUNCTIONARY: (REAL / "functionary-v3.1.jinja").read_text(),
             ToolFormat.FUNCTIONARY_V32: (REAL / "functionary-v3.2.jinja").read_text(),
             ToolFormat.KIMI_K3: (REAL / "kimi-k3.jinja").read_text(),
             ToolFormat.MINIMAX_M1: (REAL / "minimax-m1.jinja").read_text(),
             ToolFormat.HY3: (REAL / "hy3.jinja").read_text(),
             ToolFormat.DEEPSEEK: (REAL / "deepseek-r1-tools.jinja").read_text(),
             ToolFormat.SOLAR: (REAL / "solar-open.jinja").read_text(),
             ToolFormat.ATEM: (REAL / "muse-glimmer.jinja").read_text(),
             ToolFormat.MINIMAX_M3: (REAL / "minimax-m3.jinja").read_text(),
             ToolFormat.DEEPSEEK_V31: (REAL / "deepseek-v3.1.jinja").read_text()}

# Arguments a random model can only finish: every value is chosen from a few
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"enum": ["paris", "tokyo"]},
                                                           "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                          "required": ["city", "days"], "additionalProperties": False}}}
NOTE = {"type": "function", "function": {"name": "note", "parameters": {
    "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"],
    "additionalProperties": False}}}


def test_each_familys_template_is_known_by_its_form_and_one_without_tools_says_so():
    assert {tool_format(template) for template in TEMPLATES.values()} == set(ToolFormat)
    with pytest.raises(InputError, match="has no tools"):
        tool_format("{% for m in messages %}{{ m.content }}{% endfor %}")
    with pytest.raises(InputError, match="has no tools"):
        tool_format(None)
    # LFM2.5's template lists the tools without LFM2's markers (llama.cpp's LFM2.5-Instruct.jinja)
    assert tool_format('{%- if tools -%}{%- set p = p + "List of tools: [" -%}{% endif %}') is ToolFormat.LFM2
    # a form that spells <tool_call> too but writes something else: refused, not read as hermes' JSON (a <tool_calls>
    # block that is not Apriel's list)
    with pytest.raises(InputError, match="does not read yet"):
        tool_format("{% if tools %}call tools in <tool_call></tool_call> tags as <tool_calls>{\"name\": ...}"
                    "</tool_calls>{% endif %}")
    # Seed-OSS's xml in <seed:tool_call> blocks (refused before), Apriel's list: theirs, not hermes' or xml's
    for other, form in (("<seed:tool_call>\n<function=f>\n<parameter=a>1</parameter>\n</function>\n</seed:tool_call>",
                         ToolFormat.SEED),
                        ("<tool_calls>[{\"name\": ...}]</tool_calls>", ToolFormat.APRIEL)):
        assert tool_format("{% if tools %}call tools in <tool_call></tool_call> tags as " + other + "{% endif %}") is form


def read(form: ToolFormat, text: str, step: int | None = None, finish: str = "stop") -> list:
    """The answer's content pieces joined and its calls, as (name, arguments) pairs, fed `step`
    characters at a time (None: whole) through what a session's generation hands the reader (shown()), ended
    for this finish_reason."""
    size = step or len(text) or 1
    events = [Token(0, text[start:start + size], False) for start in range(0, len(text), size)]
    reader, pieces = ToolStream(form), []
    for event in shown(iter(events + [Done(finish, "", 0.0)]), form, lambda token: None):
        pieces += reader.feed(event.text if isinstance(event, Token) else event.tail)
    pieces += reader.end()
    content = "".join(p for p in pieces if isinstance(p, str))
    return [content, [(p.name, json.loads(p.arguments)) for p in pieces if not isinstance(p, str)]]


@pytest.mark.parametrize("form, text, content, calls", [
    (ToolFormat.HERMES, 'Let me look.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n'
     '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>', "Let me look.\n", [("f", {"a": 1}), ("g", {})]),
    # Qwen2.5-Coder answers with the object alone, fenced or not
    (ToolFormat.HERMES, '```json\n{"name": "f", "arguments": {"a": "<x>"}}\n```', "", [("f", {"a": "<x>"})]),
    (ToolFormat.HERMES, ' {"name": "f", "arguments": {}}', "", [("f", {})]),
    (ToolFormat.HERMES, '{"a": 1}', '{"a": 1}', []),  # JSON, but no call
    (ToolFormat.HERMES, "```python\nprint(1)\n```", "```python\nprint(1)\n```", []),
    (ToolFormat.HERMES, "a <tool of my own", "a <tool of my own", []),
    (ToolFormat.LLAMA3, '{"name": "f", "parameters": {"a": [1, 2]}}', "", [("f", {"a": [1, 2]})]),
    (ToolFormat.LLAMA3, 'The answer is {"name": "f"}', 'The answer is {"name": "f"}', []),
    (ToolFormat.MISTRAL, '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]', "",
     [("f", {"a": 1}), ("g", {})]),
    # [TOOL_CALLS] is a control token, left out of the answer's text
    (ToolFormat.MISTRAL, '[{"name": "f", "arguments": {"a": 1}}]', "", [("f", {"a": 1})]),
    (ToolFormat.MISTRAL, "[1, 2]", "[1, 2]", []),
    # Granite 3's: a JSON list after <|tool_call|> (a control token, written in by shown()), to the answer's end
    (ToolFormat.GRANITE, 'Sure.<|tool_call|>[{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]',
     "Sure.", [("f", {"a": 1}), ("g", {})]),
    (ToolFormat.GRANITE, "a <|tool of my own", "a <|tool of my own", []),
    # GigaChat 3's: the content's <|message_sep|> (a control token) left out, the role's header written in by shown()
    (ToolFormat.GIGACHAT3, 'Sure.\n\nfunction call<|role_sep|>\n{"name": "f", "arguments": {"a": 1}}', "Sure.\n\n",
     [("f", {"a": 1})]),
    (ToolFormat.GIGACHAT3, "a function call of my own", "a function call of my own", []),
    (ToolFormat.GIGACHAT31, 'Sure.<|function_call|>{"name": "f", "arguments": {"a": [1, 2]}}', "Sure.", [("f", {"a": [1, 2]})]),
    (ToolFormat.FIREFUNCTION, ' functools[{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]', " ",
     [("f", {"a": 1}), ("g", {})]),
    (ToolFormat.FIREFUNCTION, "import functools\nfunctools.partial(f)", "import functools\nfunctools.partial(f)", []),
    (ToolFormat.FUNCTIONARY, 'Let me look.<function=f>{"a": "<x>"}</function><function=g>{}</function>', "Let me look.",
     [("f", {"a": "<x>"}), ("g", {})]),
    (ToolFormat.FUNCTIONARY, "a <function of my own", "a <function of my own", []),
    # Functionary v3.2's messages, the first's `>>>` written by the prompt: `all`'s text the content
    (ToolFormat.FUNCTIONARY_V32, 'all\nLet me look.>>>f\n{"a": ">>"}>>>g\n{}', "Let me look.",
     [("f", {"a": ">>"}), ("g", {})]),
    (ToolFormat.FUNCTIONARY_V32, 'f\n{"a": 1}', "", [("f", {"a": 1})]),
    (ToolFormat.FUNCTIONARY_V32, "all\na >> b > c", "a >> b > c", []),
    (ToolFormat.FUNCTIONARY_V32, "no recipient at all", "no recipient at all", []),
    (ToolFormat.MINIMAX_M1, 'Sure.\n<tool_calls>\n{"name": "f", "arguments": {"a": "<x>\\n"}}\n{"name": "g", '
     '"arguments": {}}\n</tool_calls>', "Sure.\n", [("f", {"a": "<x>\n"}), ("g", {})]),
    # Hy3's block (its markers control tokens, written in by shown()): a string as written, any other as JSON
    (ToolFormat.HY3, "Sure.<tool_calls:opensource>\n<tool_call:opensource>f<tool_sep:opensource>\n<arg_key:opensource>a"
     "</arg_key:opensource>\n<arg_value:opensource>[1]</arg_value:opensource>\n</tool_call:opensource>\n"
     "<tool_call:opensource>g<tool_sep:opensource>\n</tool_call:opensource>\n</tool_calls:opensource>", "Sure.",
     [("f", {"a": [1]}), ("g", {})]),
    (ToolFormat.DEEPSEEK, 'Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{"a": 1}\n```'
     '<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>g\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
     "Sure.", [("f", {"a": 1}), ("g", {})]),
    # DeepSeek V3.1's, as llama.cpp's test-chat.cpp has them: calls chained in one block, each NAME<｜tool▁sep｜>{...}
    (ToolFormat.DEEPSEEK_V31, 'CONTENT<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{"city": "Paris"}'
     '<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
     "CONTENT", [("get_time", {"city": "Paris"}), ("get_weather", {"city": "Paris"})]),
    # Solar Open's tool_calls message (handed on by the reasoning splitter), to the reply's end
    (ToolFormat.SOLAR, 'Sure.<|tool_calls|><|tool_call:begin|>a1<|tool_call:name|>f<|tool_call:args|>{"a": 1}'
     '<|tool_call:end|><|tool_call:begin|>a2<|tool_call:name|>g<|tool_call:args|>{}<|tool_call:end|>', "Sure.",
     [("f", {"a": 1}), ("g", {})]),
    # MiniMax-M3's, as its template writes them (its namespace token a control token, written in by shown()): each
    # argument an element, an object's members and a list's <item>s nested in it, a number as JSON
    (ToolFormat.MINIMAX_M3, 'Sure.]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name="f">]<]minimax[>[<a>1]<]minimax[>['
     '</a>]<]minimax[>[<b>]<]minimax[>[<item>]<]minimax[>[<c>x < y</c>]<]minimax[>[</c>]<]minimax[>[</item>]<]minimax[>['
     '<item>]<]minimax[>[</item>]<]minimax[>[</b>]<]minimax[>[</invoke>\n]<]minimax[>[<invoke name="g">]<]minimax[>['
     '</invoke>\n]<]minimax[>[</tool_call>', "Sure.", [("f", {"a": 1, "b": [{"c": "x < y</c>"}, ""]}), ("g", {})]),
    # Muse Glimmer's blocks, one a call, as the reasoning splitter hands its tool messages on
    (ToolFormat.ATEM, '<atem:function_calls>\n<atem:invoke name="f">\n<atem:parameter name="a">1</atem:parameter>\n'
     '</atem:invoke>\n</atem:function_calls><atem:function_calls>\n<atem:invoke name="g">\n</atem:invoke>\n'
     '</atem:function_calls>', "", [("f", {"a": 1}), ("g", {})]),
    # Kimi K3's tools section (its markers control tokens, written into the text; the splitter hands the section on)
    (ToolFormat.KIMI_K3, 'Let me look.<|open|>tools<|sep|><|open|>call tool="f" index="1"<|sep|><|open|>argument key="a"'
     ' type="number"<|sep|>1<|close|>argument<|sep|><|open|>argument key="s" type="string"<|sep|>x < "y"<|close|>argument'
     '<|sep|><|close|>call<|sep|><|open|>call tool="g" index="2"<|sep|><|close|>call<|sep|><|close|>tools<|sep|>',
     "Let me look.", [("f", {"a": 1, "s": 'x < "y"'}), ("g", {})]),
    # (arguments that came as text, as its template writes them back: one json section)
    (ToolFormat.KIMI_K3, '<|open|>tools<|sep|><|open|>call tool="a&amp;b" index="1"<|sep|><|open|>json type="object"'
     '<|sep|>{"a": [1]}<|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|>', "", [("a&b", {"a": [1]})]),
    # Command R7B's list, laid out as its template writes earlier calls (its markers written in by shown())
    (ToolFormat.COMMAND_R7B, 'Let me look.<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "f", "parameters":'
     ' {"a": 1}},\n    {"tool_call_id": "1", "tool_name": "g", "parameters": {}}\n]<|END_ACTION|>', "Let me look.",
     [("f", {"a": 1}), ("g", {})]),
    # (its arguments under OpenAI's key, which the list's check took: read, not a KeyError)
    (ToolFormat.COMMAND_R7B, '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "f", "arguments": {"a": 1}}]'
     '<|END_ACTION|>', "", [("f", {"a": 1})]),
    # Qwen3.5's and Qwen3-Coder's: a string as written (one newline either side is the layout), others as JSON,
    # a boolean as Python writes it too
    (ToolFormat.XML, 'Let me look.\n\n<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n<parameter=code>\n'
     '  if a < b:\n    pass\n</parameter>\n<parameter=ok>\nTrue\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n'
     '<function=g>\n</function>\n</tool_call>', "Let me look.\n\n",
     [("f", {"a": 1, "code": "  if a < b:\n    pass", "ok": True}), ("g", {})]),
    (ToolFormat.XML, "a <tool of my own", "a <tool of my own", []),
    (ToolFormat.GLM, '<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>[1, 2]</arg_value>\n<arg_key>b</arg_key>\n'
     '<arg_value>some text</arg_value>\n</tool_call>', "", [("f", {"a": [1, 2], "b": "some text"})]),
    # Gemma 4's, as llama.cpp's test-chat.cpp has them: strings between <|"|> marks, keys unquoted
    (ToolFormat.GEMMA4, 'Hello, world!\nWhat\'s up?<|tool_call>call:get_time{city:<|"|>San Francisco<|"|>}<tool_call|>'
     '<|tool_call>call:f{a:-7,b:3.14,c:true,d:null,e:[<|"|>x<|"|>,1],g:{k:<|"|>v, w<|"|>}}<tool_call|>',
     "Hello, world!\nWhat's up?",
     [("get_time", {"city": "San Francisco"}), ("f", {"a": -7, "b": 3.14, "c": True, "d": None, "e": ["x", 1],
                                                     "g": {"k": "v, w"}})]),
    (ToolFormat.GEMMA4, "<|tool_call>call:empty_args{}<tool_call|>", "", [("empty_args", {})]),
    # Mistral Small 3.2's (a call id before [ARGS]) and Devstral's, as llama.cpp's test-chat.cpp has them; their
    # markers are control tokens, which the session writes into the text for this reader (shown())
    (ToolFormat.MISTRAL_ARGS, 'Hello, world!\nWhat\'s up?[TOOL_CALLS]special_function[CALL_ID]000000001[ARGS]{"arg1": 1}'
     '[TOOL_CALLS]special_function_with_opt[ARGS]{"arg1": 1, "arg2": 2}', "Hello, world!\nWhat's up?",
     [("special_function", {"arg1": 1}), ("special_function_with_opt", {"arg1": 1, "arg2": 2})]),
    # MiniMax-M2's, as llama.cpp's test-chat.cpp has them: <invoke>s in one block, values as in xml
    (ToolFormat.MINIMAX, 'Sure.\n<minimax:tool_call>\n<invoke name="special_function">\n<parameter name="arg1">1'
     '</parameter>\n<parameter name="code">a </invoke> b</parameter>\n</invoke>\n<invoke name="empty_args">\n</invoke>\n'
     '</minimax:tool_call>', "Sure.\n", [("special_function", {"arg1": 1, "code": "a </invoke> b"}), ("empty_args", {})]),
    # DeepSeek V3.2's and V4's DSML, as their templates write earlier calls: a key's string="true" value as written
    # (a JSON-looking one too), "false" as JSON
    (ToolFormat.DSML, 'Sure.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="special_function">\n<｜DSML｜parameter'
     ' name="arg1" string="false">1</｜DSML｜parameter>\n<｜DSML｜parameter name="code" string="true">[1] </｜DSML｜invoke>'
     '</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name="empty_args">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>',
     "Sure.\n\n", [("special_function", {"arg1": 1, "code": "[1] </｜DSML｜invoke>"}), ("empty_args", {})]),
    (ToolFormat.DSML_FUNCTIONS, '\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="a"'
     ' string="false">{"b": [true, null]}</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>', "\n\n",
     [("f", {"a": {"b": [True, None]}})]),
    # MiniCPM5's: calls one after another, no block around them; a string with <, & or a newline in CDATA
    (ToolFormat.MINICPM5, 'Let me look.<function name="f"><param name="a">1</param><param name="code"><![CDATA[if a < b:\n'
     '  x = "</function>"]]></param><param name="name">Bob</param></function>\n<function name="g"></function>',
     "Let me look.", [("f", {"a": 1, "code": 'if a < b:\n  x = "</function>"', "name": "Bob"}), ("g", {})]),
    (ToolFormat.MINICPM5, "a <function of my own", "a <function of my own", []),
    # Apertus': a list of calls, each an object of one key, the name (its markers control tokens, written in by shown())
    (ToolFormat.APERTUS, 'Sure.<|tools_prefix|>[{"special_function": {"arg1": 1}}, {"empty_args": {}}]<|tools_suffix|>',
     "Sure.", [("special_function", {"arg1": 1}), ("empty_args", {})]),
    # Kimi K2's: a section of calls, each's id what it writes before its arguments (its markers are control tokens,
    # which the session writes into the text for this reader)
    (ToolFormat.KIMI, 'Sure.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0'
     '<|tool_call_argument_begin|>{"city": "paris"}<|tool_call_end|>\n<|tool_call_begin|>functions.empty_args:1'
     '<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>', "Sure.",
     [("get_weather", {"city": "paris"}), ("empty_args", {})]),
    # LFM2's Python-style calls, as llama.cpp's test-chat.cpp has them: JSON's values or Python's, a list a block
    (ToolFormat.LFM2, 'Let me check the time.<|tool_call_start|>[get_time(city="Paris")]<|tool_call_end|>',
     "Let me check the time.", [("get_time", {"city": "Paris"})]),
    (ToolFormat.LFM2, '<|tool_call_start|>[special_function(arg1=1), special_function_with_opt(arg1=1, arg2=2)]'
     '<|tool_call_end|><|tool_call_start|>[empty_args()]<|tool_call_end|>', "",
     [("special_function", {"arg1": 1}), ("special_function_with_opt", {"arg1": 1, "arg2": 2}), ("empty_args", {})]),
    (ToolFormat.LFM2, '<|tool_call_start|>[set_config(config={"enabled": True, "count": 3, "note": null}), '
     'toggle(enabled=True, value=None)]<|tool_call_end|>', "",
     [("set_config", {"config": {"enabled": True, "count": 3, "note": None}}), ("toggle", {"enabled": True, "value": None})]),
    (ToolFormat.LFM2, '<|tool_call_start|>[python(code="def hello():\\n    print(\'hey\')", quoted=\'it\\\'s\'), '
     'Calendar.create_event(title="demo", participants=["Alice", "Bob"], at=-1.5e3)]<|tool_call_end|>', "",
     [("python", {"code": "def hello():\n    print('hey')", "quoted": "it's"}),
      ("Calendar.create_event", {"title": "demo", "participants": ["Alice", "Bob"], "at": -1500.0})]),
])
def test_an_answer_reads_the_same_whole_as_streamed_a_character_at_a_time(form, text, content, calls):
    assert read(form, text) == read(form, text, step=1) == read(form, text, step=3) == [content, calls]


# code an agent asks a model to write, holding each JSON form's closing
CODE = ('print("</tool_call>", "</tool_calls>", "]</TOOLCALL>", "</function>", "<|END_ACTION|>", "<｜tool▁calls▁end｜>")'
        ' # \\ "')


@pytest.mark.parametrize("form, written", [
    (ToolFormat.HERMES, lambda call: f"<tool_call>\n{json.dumps(call)}\n</tool_call>"),
    (ToolFormat.MINIMAX_M1, lambda call: f"<tool_calls>\n{json.dumps(call)}\n</tool_calls>"),
    (ToolFormat.NEMOTRON, lambda call: f"<TOOLCALL>[{json.dumps(call)}]</TOOLCALL>"),
    (ToolFormat.FUNCTIONARY, lambda call: f"<function={call['name']}>{json.dumps(call['arguments'])}</function>"),
    (ToolFormat.DEEPSEEK, lambda call: f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n"
     f"{json.dumps(call['arguments'])}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    (ToolFormat.DEEPSEEK_V31, lambda call: f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>"
     f"{json.dumps(call['arguments'])}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    (ToolFormat.COMMAND_R7B, lambda call: '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "f", "parameters": '
     f"{json.dumps(call['arguments'])}}}]<|END_ACTION|>"),
])
def test_a_json_calls_string_may_hold_its_forms_closing(form, written):
    """A JSON call's string that holds its form's closing (code that writes `</tool_call>`) is a value's text: the
    call was cut there before, and read as not JSON."""
    call = {"name": "f", "arguments": {"code": CODE}}
    for step in (None, 1):
        assert read(form, "Sure." + written(call), step) == ["Sure.", [("f", {"code": CODE})]]


MARKUP_CODE = 'print("</tool_call>", "</minimax:tool_call>", "</tool_calls:opensource>", "<parameter=x>")'


@pytest.mark.parametrize("form, written", [
    (ToolFormat.XML, lambda code: f"<tool_call>\n<function=f>\n<parameter=code>\n{code}\n</parameter>\n</function>\n"
     "</tool_call>"),
    (ToolFormat.GLM, lambda code: f"<tool_call>f\n<arg_key>code</arg_key>\n<arg_value>{code}</arg_value>\n</tool_call>"),
    (ToolFormat.MINIMAX, lambda code: f'<minimax:tool_call>\n<invoke name="f">\n<parameter name="code">{code}'
     "</parameter>\n</invoke>\n</minimax:tool_call>"),
    (ToolFormat.HY3, lambda code: "<tool_calls:opensource>\n<tool_call:opensource>f<tool_sep:opensource>\n"
     f"<arg_key:opensource>code</arg_key:opensource>\n<arg_value:opensource>{code}</arg_value:opensource>\n"
     "</tool_call:opensource>\n</tool_calls:opensource>"),
])
def test_a_markup_calls_value_may_hold_its_forms_closing(form, written):
    """A markup call's value is text as written up to its own closing tag: one that holds the block's closing (code
    that writes `</tool_call>`) is the value's text; the call was cut there before."""
    for step in (None, 1):
        assert read(form, "Sure." + written(MARKUP_CODE), step) == ["Sure.", [("f", {"code": MARKUP_CODE})]]


def test_content_is_passed_on_at_once_but_what_may_open_a_call_waits():
    reader = ToolStream(ToolFormat.HERMES)
    assert reader.feed("Sure, ") == ["Sure, "]
    assert reader.feed("<tool") == []  # may be the opening
    assert reader.feed("kit ") == ["<toolkit "]  # was not
    assert reader.feed('<tool_call>{"name": "f", "arguments": {}}') == []
    [call] = reader.feed("</tool_call>")
    assert call.name == "f" and call.arguments == "{}" and call.id.startswith("call_")
    reader = ToolStream(ToolFormat.MISTRAL)  # its calls are one list: they come when it has ended
    assert reader.feed('[{"name": "f", "arguments": {}}]') == []
    [call] = reader.end()
    assert call.name == "f"


def test_a_kimi_call_keeps_the_id_the_model_wrote_which_its_template_writes_back():
    reader = ToolStream(ToolFormat.KIMI)
    [content, call] = reader.feed("Let me see.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:3"
                                  '<|tool_call_argument_begin|>{"city": "paris", "days": 2}<|tool_call_end|>'
                                  "<|tool_calls_section_end|>") + reader.end()
    assert content == "Let me see." and (call.id, call.name) == ("functions.get_weather:3", "get_weather")
    called = {"role": "assistant", "content": "", "tool_calls": [{"id": call.id, "type": "function", "function": {
        "name": call.name, "arguments": call.arguments}}]}
    written = render(TEMPLATES[ToolFormat.KIMI], [*ASK, called, {"role": "tool", "tool_call_id": call.id, "content": "sun"}],
                     "", "", tools=[WEATHER])
    assert ("<|tool_call_begin|>functions.get_weather:3<|tool_call_argument_begin|>" in written
            and "## Return of functions.get_weather:3\nsun" in written)
    for wrong in ("<|tool_calls_section_begin|><|tool_call_begin|>get_weather<|tool_call_argument_begin|>{}"
                  "<|tool_call_end|><|tool_calls_section_end|>",
                  "<|tool_calls_section_begin|>{}<|tool_calls_section_end|>"):
        with pytest.raises(InputError, match="Kimi's functions.NAME:INDEX|without calls"):
            ToolStream(ToolFormat.KIMI).feed(wrong)


@pytest.mark.parametrize("form, text", [
    (ToolFormat.HERMES, '<tool_call>\n{"name": "f", "argu'),
    (ToolFormat.HERMES, '{"name": "f", "arguments": {"a"'),
    (ToolFormat.LLAMA3, '{ "name": "f", "parameters": {'),
    (ToolFormat.MISTRAL, '[TOOL_CALLS][{"name": "f", "arguments": {}}'),
    (ToolFormat.XML, "<tool_call>\n<function=f>\n<parameter=a>\n1"),
    (ToolFormat.GLM, "<tool_call>f\n<arg_key>a</arg_key>"),
    (ToolFormat.GEMMA4, '<|tool_call>call:f{a:<|"|>x'),
    (ToolFormat.MISTRAL_ARGS, '[TOOL_CALLS]f[ARGS]{"a": '),
    (ToolFormat.LFM2, "<|tool_call_start|>[special_function(arg1="),
    (ToolFormat.MINIMAX, '<minimax:tool_call>\n<invoke name="f">\n<parameter name="a">1</parameter>\n</invoke>'),
    (ToolFormat.KIMI, '<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{"a": 1}'),
    (ToolFormat.DSML, '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="a" string="true">x'),
    (ToolFormat.MINICPM5, '<function name="f"><param name="a">1</param>'),
    (ToolFormat.APERTUS, '<|tools_prefix|>[{"f": {"a": 1}}'),
    (ToolFormat.GRANITE, '<|tool_call|>[{"name": "f", "arguments": {}}'),
    (ToolFormat.GIGACHAT3, 'function call<|role_sep|>\n{"name": "f", "arguments": {"a"'),
    (ToolFormat.GIGACHAT31, '<|function_call|>{"name": "f", "arguments": {}'),
    (ToolFormat.FIREFUNCTION, 'functools[{"name": "f", "arguments": {}}'),
    (ToolFormat.FUNCTIONARY, '<function=f>{"a": 1}'),
    (ToolFormat.FUNCTIONARY_V32, 'all\nSure.>>>f\n{"a": 1'),
    (ToolFormat.KIMI_K3, '<|open|>tools<|sep|><|open|>call tool="f" index="1"<|sep|><|open|>argument key="a"'),
    (ToolFormat.MINIMAX_M1, '<tool_calls>\n{"name": "f", "arguments": {}}\n'),
    (ToolFormat.HY3, "<tool_calls:opensource>\n<tool_call:opensource>f<tool_sep:opensource>\n"),
    (ToolFormat.DEEPSEEK, '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{"a": 1}'),
    (ToolFormat.SOLAR, '<|tool_calls|><|tool_call:begin|>a1<|tool_call:name|>f<|tool_call:args|>{"a": 1}'),
    (ToolFormat.MINIMAX_M3, ']<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name="f">]<]minimax[>[<a>1'),
    (ToolFormat.DEEPSEEK_V31, '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{"a": 1}<｜tool▁call▁end｜>'),
])
def test_a_call_cut_off_is_unfinished(form, text):
    with pytest.raises(UnfinishedCall, match="ended inside a tool call"):
        read(form, text, finish="length")


def test_markup_forms_read_each_value_as_its_schema_says():
    """A string parameter's value is the text written, even where it reads as JSON; others are JSON."""
    tools = Tools(({"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "n": {"type": "string"}, "m": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}}}}},))
    reader = ToolStream(ToolFormat.XML, tools=tools)
    [call] = reader.feed("<tool_call>\n<function=f>\n<parameter=n>\n42\n</parameter>\n<parameter=m>\n42\n</parameter>\n"
                         '<parameter=tags>\n["a", "b"]\n</parameter>\n</function>\n</tool_call>') + reader.end()
    assert call.argument_values == {"n": "42", "m": 42, "tags": ["a", "b"]}
    with pytest.raises(InputError, match="without a name"):
        ToolStream(ToolFormat.GLM).feed("<tool_call>\n</tool_call>")


EDIT = {"type": "function", "function": {"name": "edit", "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}, "count": {"type": "integer"}, "dry": {"type": "boolean"},
    "edits": {"type": "array", "items": {"type": "object", "properties": {
        "old": {"type": "string"}, "new": {"type": ["string", "null"]}}, "required": ["old", "new"]}},
    "tags": {"type": "array", "items": {"type": "string"}}, "meta": {"type": "object"}}, "required": ["path", "edits"]}}}
EDITED = {"path": "a.py", "count": 2, "dry": False, "edits": [{"old": "if a < b:", "new": "42"}, {"old": "", "new": "x"}],
          "tags": ["1", "two"], "meta": {"by": "me", "n": 3}}  # (an object that names no members: 3 reads as JSON)


def test_minimax_m3s_calls_nest_as_the_schema_nests_and_read_back_as_its_template_writes_them(target):
    """MiniMax-M3's namespaced calls (refused before: "does not read yet"), its arguments elements nested as the
    schema nests objects and lists: what its own template writes of an earlier call is read back to the same
    arguments, whole and a character at a time, and its grammar admits it (a string's value any text, even a
    closing's, but not the namespace token)."""
    called = {"role": "assistant", "content": "Sure.", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "edit", "arguments": EDITED}}]}
    written = render(TEMPLATES[ToolFormat.MINIMAX_M3], [*ASK, called], "", "", tools=[EDIT])
    answer = written[written.rindex("Sure."):]
    block = answer[answer.index("]<]minimax[>[<tool_call>"):answer.index("[e~[")]
    assert "<item>" in block and "<by>me" in block  # (nested, not JSON)
    for step in (None, 1):
        reader = ToolStream(ToolFormat.MINIMAX_M3, tools=Tools((EDIT,)))
        pieces = [piece for at in range(0, len(block), step or len(block)) for piece in
                  reader.feed(block[at:at + (step or len(block))])] + reader.end()
        [call] = pieces
        assert call.name == "edit" and call.argument_values == EDITED
    gbnf, _ = constraint(ToolFormat.MINIMAX_M3, Tools((EDIT,), choice="required"))
    with Grammar(target.model, gbnf) as grammar:
        for token in tokens_of(target, block):
            assert grammar.admits(token)
            grammar.accept(token)
    string = block[:block.index("if a < b:")]
    with Grammar(target.model, gbnf) as grammar:
        for token in tokens_of(target, string + "a ]<]minimax[>["):  # (the token ends the value: its closing follows)
            grammar.accept(token)
        assert not grammar.admits(tokens_of(target, "x")[0]) and grammar.admits(tokens_of(target, "<")[0])


def test_glm_is_known_by_its_own_tags_not_taken_for_hermes():
    """GLM-4.5's template writes <tool_call>NAME<arg_key>...: read as hermes' JSON, its calls were held to a
    JSON object it was never taught."""
    assert tool_format(TEMPLATES[ToolFormat.GLM]) is ToolFormat.GLM
    assert tool_format((REAL / "qwen3.jinja").read_text()) is ToolFormat.HERMES


@pytest.mark.parametrize("form", [ToolFormat.XML, ToolFormat.GLM, ToolFormat.GEMMA4])
def test_a_markup_calls_grammar_holds_each_string_value_to_any_text_but_its_closing_tag(target, form):
    """A string's value may hold what its closing tag begins with (a < b, </para) but not the tag itself."""
    gbnf, _ = constraint(form, Tools((NOTE,), choice="required"))
    opening = {ToolFormat.XML: "<tool_call>\n<function=note>\n<parameter=text>\n",
               ToolFormat.GLM: "<tool_call>note\n<arg_key>text</arg_key>\n<arg_value>",
               ToolFormat.GEMMA4: '<|tool_call>call:note{text:<|"|>'}[form]
    closing = {ToolFormat.XML: "</parameter>", ToolFormat.GLM: "</arg_value>", ToolFormat.GEMMA4: '<|"|>'}[form]
    with Grammar(target.model, gbnf) as grammar:
        for token in tokens_of(target, opening + "if a < b: " + closing[:-1]):
            assert grammar.admits(token)
            grammar.accept(token)
        # the tag's last character would end the value: only what follows it in the form may come then
        last = tokens_of(target, closing[-1])[0]
        assert grammar.admits(last)
        grammar.accept(last)
        assert not grammar.admits(tokens_of(target, "x")[0])


@pytest.mark.slow
@pytest.mark.parametrize("form", [ToolFormat.XML, ToolFormat.GLM, ToolFormat.GEMMA4, ToolFormat.LFM2])
def test_a_long_string_value_leaves_a_real_vocabularys_row_checkable(real_model, form):
    """With a rule a character for the text inside a value (a matcher's states), checking one row of the
    real Qwen vocabulary's 151,936 tokens in a code argument was refused as taking over 2 s, and the request
    failed; character classes and repetitions check it well within that."""
    model = Model(real_model("qwen2.5-coder-1.5b"), vocab_only=True)
    gbnf, _ = constraint(form, Tools((NOTE,), choice="required"))
    opening = {ToolFormat.XML: "<tool_call>\n<function=note>\n<parameter=text>\n",
               ToolFormat.GLM: "<tool_call>note\n<arg_key>text</arg_key>\n<arg_value>",
               ToolFormat.GEMMA4: '<|tool_call>call:note{text:<|"|>',
               ToolFormat.LFM2: "<|tool_call_start|>[note(text='"}[form]
    code = "def f(a, b):\n    if a < b:\n        return [x for x in range(a) if x % 2]\n    return {'k': a}\n" * 8
    if form is ToolFormat.LFM2:  # (between single quotes, as LFM2.5's template writes a string)
        code = code.replace("'", "\\'")
    with Grammar(model, gbnf) as grammar:
        for token in model.tokenize(opening + code, add_special=False, parse_special=False):
            grammar.accept(token)
        admitted = grammar.admitted(np.zeros(model.n_vocab, np.float32))
    assert len(admitted) > 100_000  # (nearly any text goes on a string)


def test_a_forms_control_token_markers_are_written_into_the_text_for_its_reader():
    """Mistral Nemo's [TOOL_CALLS] is a control token: left out of the text, a call after some content
    ("Sure.[{...}]") was read as content; written in, it is a call. Other forms' events are left as they are."""
    control = {7: "[TOOL_CALLS]", 8: "<|im_end|>"}.get
    events = [Token(1, "Sure.", False), Token(7, "", False), Token(2, '[{"name": "f", "arguments": {}}]', False),
              Token(8, "", False)]
    text = "".join(event.text for event in shown(iter(events), ToolFormat.MISTRAL, control))
    assert text == 'Sure.[TOOL_CALLS][{"name": "f", "arguments": {}}]'
    assert read(ToolFormat.MISTRAL, text) == ["Sure.", [("f", {})]]
    assert list(shown(iter(events), ToolFormat.HERMES, control)) == events


def test_mistrals_ids_are_the_nine_letters_and_digits_its_templates_insist_on():
    reader = ToolStream(ToolFormat.MISTRAL)
    [call] = reader.feed('[TOOL_CALLS][{"name": "f", "arguments": {}}]') + reader.end()
    assert len(call.id) == 9 and call.id.isalnum()


def test_an_answer_the_grammar_never_held_is_content_however_it_ends():
    # the 1.5B after a tool result, imitating it: the whole-answer trigger never matched `{{"name"`
    text = '{{"name": "get_weather", "arguments": {"city": "Paris"}, "response": {"temperatu'
    reader = ToolStream(ToolFormat.HERMES)
    assert "".join(reader.feed(text) + reader.end()) == text
    cut = ToolStream(ToolFormat.HERMES)
    with pytest.raises(UnfinishedCall):  # one the grammar held, cut off
        cut.feed('{"name": "get_weather", "arguments": {"ci') + cut.end()


def test_tools_with_one_name_twice_or_a_choice_not_offered_are_refused():
    with pytest.raises(InputError, match="same name"):
        Tools((WEATHER, WEATHER))
    with pytest.raises(InputError, match="not one of the tools"):
        Tools((WEATHER,), choice="get_time")


def tokens_of(target, text: str) -> list[int]:
    """The text's tokens, without the space the tiny tokenizer puts before a text (a grammar that does not
    admit a token must never be given it: llama.cpp aborts)."""
    tokens = target.model.tokenize(text, add_special=False, parse_special=False)
    return tokens[1:] if target.model.piece(tokens[0]) == b" " else tokens


def test_auto_lets_the_model_write_freely_until_it_opens_a_call_then_holds_it_to_the_tools(target):
    gbnf, triggers = constraint(ToolFormat.HERMES, Tools((WEATHER,)))
    assert triggers
    anything = np.zeros(target.model.n_vocab, np.float32)
    with Grammar(target.model, gbnf, triggers) as grammar:
        assert grammar.awaiting and grammar.admitted(anything) is None  # no mask: any text until a call opens
        for token in tokens_of(target, "let me see. <tool_call>"):
            assert grammar.admits(token)
            grammar.accept(token)
        assert not grammar.awaiting
        admitted = {target.model.piece(int(t)) for t in grammar.admitted(anything)}
        assert b"{" in admitted and b"a" not in admitted
        for token in tokens_of(target, '{"name": "get_weather", "arguments": {"city": "'):
            grammar.accept(token)
        assert {target.model.piece(int(t)) for t in grammar.admitted(anything)} <= {b"p", b"t", b"<0x70>", b"<0x74>"}
    assert constraint(ToolFormat.HERMES, Tools((WEATHER,), choice="none")) == (None, ())


@pytest.mark.parametrize("form, free, opening", [
    # Functionary v3.2: the content's recipient, `all`, and its lines set nothing off; a function's name does, first
    # or after the content
    (ToolFormat.FUNCTIONARY_V32, "all\nsee:\nmore\n", ">>>get_weather\n"),
    (ToolFormat.FUNCTIONARY_V32, "", "get_weather\n"),
    # GigaChat 3: the content's end alone (<|message_sep|>) sets nothing off; the function call's turn does
    (ToolFormat.GIGACHAT3, "a function call<|message_sep|>\n\n", "<|message_sep|>\n\nfunction call<|role_sep|>\n"),
    (ToolFormat.FIREFUNCTION, "import functools\nfunctools.reduce", " functools["),
])
def test_content_leaves_a_lazy_grammar_waiting_and_a_forms_call_sets_it_off(target, form, free, opening):
    gbnf, triggers = constraint(form, Tools((WEATHER,)))
    with Grammar(target.model, gbnf, triggers) as grammar:
        for token in tokens_of(target, free) if free else []:
            grammar.accept(token)
        assert grammar.awaiting
        for token in tokens_of(target, opening):
            grammar.accept(token)
        assert not grammar.awaiting
        for token in tokens_of(target, '{"city": "paris", "days": 2}' if form is ToolFormat.FUNCTIONARY_V32
                               else '{"name": "get_weather", "arguments": {"city": "paris", "days": 2}}'):
            grammar.accept(token)


def test_a_token_that_would_set_off_the_grammar_with_text_it_refuses_is_not_admitted(target):
    """llama.cpp's lazy grammar replayed the text from the trigger on unchecked and threw, which ended the
    server (a model wrote `{` and a newline where the schema allowed a space): such a token is refused,
    and accepting it anyway is an InputError, not an abort."""
    gbnf, trigger = 'root ::= "{" " "? "\\"name\\"" [a-z]*', r'^\s*(\{\s*"name")[\s\S]*$'
    refused = tokens_of(target, '{\n"name"')
    with Grammar(target.model, gbnf, (trigger,)) as grammar:
        for token in refused[:-1]:  # no trigger yet: any text
            assert grammar.admits(token)
            grammar.accept(token)
        assert grammar.awaiting and not grammar.admits(refused[-1])
        with pytest.raises(InputError, match="would set off the grammar"):
            grammar.accept(refused[-1])
        logits = np.zeros(target.model.n_vocab, np.float32)
        logits[refused[-1]] = 9.0
        assert grammar.best(logits) != refused[-1]
        assert refused[-1] not in grammar.restrict(Dist(np.array([refused[-1], 5]), np.array([0.9, 0.1]))).ids
    with Grammar(target.model, gbnf, (trigger,)) as grammar:
        for token in tokens_of(target, '{ "name"'):
            grammar.accept(token)
        assert not grammar.awaiting  # set off, and holding from here on: letters, or the end
        letter, digit = (tokens_of(target, c)[0] for c in "a1")
        assert grammar.admits(letter) and not grammar.admits(digit)
        with pytest.raises(InputError, match="does not admit"):
            grammar.accept(digit)


@pytest.mark.parametrize("form, one_call, another", [
    (ToolFormat.HERMES, '<tool_call>{"name": "get_time", "arguments": {"zone": "utc"}}</tool_call>', "<"),
    (ToolFormat.MISTRAL, '[TOOL_CALLS][{"name": "get_time", "arguments": {"zone": "utc"}}', ","),
    (ToolFormat.XML, "<tool_call>\n<function=get_time>\n<parameter=zone>\nutc\n</parameter>\n</function>\n</tool_call>",
     "<"),
    (ToolFormat.GEMMA4, '<|tool_call>call:get_time{zone:<|"|>utc<|"|>}<tool_call|>', "<"),
    (ToolFormat.LFM2, '<|tool_call_start|>[get_time(zone="utc")', ","),
    # (its block's end begins as another call does: `<`, then `/` or `i`)
    (ToolFormat.MINIMAX, '<minimax:tool_call>\n<invoke name="get_time">\n<parameter name="zone">utc</parameter>\n'
     '</invoke>\n<', "i"),
])
def test_parallel_calls_may_follow_one_another_unless_the_request_says_not(target, form, one_call, another):
    anything = np.zeros(target.model.n_vocab, np.float32)
    for parallel in (True, False):
        gbnf, _ = constraint(form, Tools((CLOCK,), choice="required", parallel=parallel))
        with Grammar(target.model, gbnf) as grammar:
            for token in tokens_of(target, one_call):
                grammar.accept(token)
            admitted = {target.model.piece(int(t)) for t in grammar.admitted(anything)}
            assert (another.encode() in admitted) == parallel


def generate(target, drafter, prompt, sampling: Sampling, tokens: int = 240):
    return record(speculative.generate(target, drafter, prompt, sampling, Speculation(draft_max=4, p_min=0.0),
                                       Limits(max_tokens=tokens)))


# (harmony's calls are held by no grammar: test_reasoning.py has gpt-oss call a tool; Kimi K3's markers, spelled a
# letter a token by this model, outgrow its context, and Muse Glimmer's address is left out by its reasoning splitter:
# test_qwen35s_glms_and_gemma4s... has each call one)
@pytest.mark.parametrize("form", [form for form in ToolFormat
                                  if form not in (ToolFormat.HARMONY, ToolFormat.KIMI_K3, ToolFormat.ATEM)])
def test_required_calls_are_calls_to_offered_tools_with_their_arguments_and_speculation_keeps_them(
        load, target, prompt, form):
    """A random model under the grammar: every answer parses into calls of the offered tools whose
    arguments follow their schemas, greedy and sampled, and a draft model changes no greedy token."""
    # (one call an answer: a random model under a grammar for several may never stop calling)
    for tools in (Tools((WEATHER, CLOCK), choice="required", parallel=False),
                  Tools((WEATHER, CLOCK), choice="get_time", parallel=False)):
        gbnf, triggers = constraint(form, tools)
        greedy = Sampling(temperature=0, grammar=gbnf, grammar_triggers=triggers)
        plain = generate(target, NoDrafter(), prompt, greedy)
        drafted = generate(target, ModelDrafter(load("partial"), 0.0, target.model.n_vocab), prompt, greedy)
        assert drafted.text == plain.text and drafted.summary().drafted > 0
        for outcome in [plain] + [generate(target, NoDrafter(), prompt, replace(greedy, temperature=1.0, seed=seed))
                                  for seed in range(3)]:
            assert outcome.finish_reason == "stop", outcome.text
            content, calls = read(form, outcome.text)
            if form is ToolFormat.GIGACHAT3:  # (the separator before its call: a control token, hidden, that this
                content = content.replace("<|message_sep|>", "").strip()  # model's vocabulary spells as text)
            assert content == "" and len(calls) == 1
            for name, arguments in calls:
                assert name in ("get_weather", "get_time") if tools.choice == "required" else name == "get_time"
                if name == "get_weather":
                    # (an integer, unbounded: llama-cpp-python's converter leaves out minimum and maximum)
                    assert arguments["city"] in ("paris", "tokyo") and type(arguments["days"]) is int
                else:
                    assert arguments == {"zone": arguments["zone"]} and arguments["zone"] in ("utc", "cet")


# Two tools as pydantic writes nested models: each `$defs` holds an `Item`, of another shape in each ($defs were named
# from the call wrapper's root, a 400 with every form but three; two Items of one name shared the first one's rule)
ORDER = {"type": "function", "function": {"name": "order", "parameters": {
    "$defs": {"Item": {"type": "object", "properties": {"sku": {"enum": ["a1", "b2"], "type": "string"},
                                                        "count": {"$ref": "#/$defs/Count"}},
                       "required": ["sku", "count"], "additionalProperties": False},
              "Count": {"type": "integer", "minimum": 1, "maximum": 9}},
    "type": "object", "properties": {"item": {"$ref": "#/$defs/Item"}}, "required": ["item"],
    "additionalProperties": False}}}
LABEL = {"type": "function", "function": {"name": "label", "parameters": {
    "$defs": {"Item": {"enum": ["red", "blue"], "type": "string"}},
    "type": "object", "properties": {"colour": {"$ref": "#/$defs/Item", "description": "its colour"}},
    "required": ["colour"], "additionalProperties": False}}}


# (as above; Hy3's and MiniMax-M3's markers, spelled a letter a token, around a nested object outgrow this model's
# context)
@pytest.mark.parametrize("form", [form for form in ToolFormat if form not in (
    ToolFormat.HARMONY, ToolFormat.KIMI_K3, ToolFormat.ATEM, ToolFormat.HY3, ToolFormat.MINIMAX_M3)])
def test_a_tools_refs_to_its_own_definitions_hold_its_calls_in_every_form(target, prompt, form):
    for choice, temperature in (("required", 1.0), ("label", 0.0)):
        gbnf, triggers = constraint(form, Tools((ORDER, LABEL), choice=choice, parallel=False))
        sampling = Sampling(temperature=temperature, seed=1, grammar=gbnf, grammar_triggers=triggers)
        outcome = generate(target, NoDrafter(), prompt, sampling)
        assert outcome.finish_reason == "stop", outcome.text
        [(name, arguments)] = read(form, outcome.text)[1]
        if name == "order":
            assert choice == "required" and arguments["item"]["sku"] in ("a1", "b2"), arguments
            assert type(arguments["item"]["count"]) is int and 1 <= arguments["item"]["count"] <= 9
        else:
            assert name == "label" and arguments == {"colour": arguments["colour"]}, arguments
            assert arguments["colour"] in ("red", "blue")


def test_a_tool_whose_refs_contain_themselves_or_point_nowhere_is_said_by_name(target):
    for form in ToolFormat:  # (those the test above leaves out: their grammars compile)
        gbnf, _ = constraint(form, Tools((ORDER, LABEL), choice="required"))
        if gbnf is not None:
            Grammar(target.model, gbnf).close()
    tree = {"type": "function", "function": {"name": "tree", "parameters": {
        "$defs": {"Node": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}},
        "type": "object", "properties": {"root": {"$ref": "#/$defs/Node"}}}}}
    with pytest.raises(InputError, match=r"tools: tree's parameters: \$ref #/\$defs/Node contains itself"):
        constraint(ToolFormat.HERMES, Tools((tree,)))
    lost = {"type": "function", "function": {"name": "lost", "parameters": {
        "type": "object", "properties": {"a": {"$ref": "#/$defs/Gone"}}}}}
    with pytest.raises(InputError, match=r"tools: lost's parameters: \$ref #/\$defs/Gone points to nothing"):
        constraint(ToolFormat.XML, Tools((lost,)))
    # (a schema the converter refuses, or properties not an object, said of the tool, not of the call's wrapper)
    for parameters, said in [({"type": "object", "properties": {"a": {"type": "nope"}}}, "Unrecognized schema"),
                             ({"type": "object", "properties": ["a"]}, "its properties an object")]:
        bad = {"type": "function", "function": {"name": "bad", "parameters": parameters}}
        for form in (ToolFormat.HERMES, ToolFormat.XML, ToolFormat.MINIMAX_M3):
            with pytest.raises(InputError, match=rf"^tools: bad's parameters: .*{said}") as refused:
                constraint(form, Tools((bad,)))
            assert "'name': {'const'" not in str(refused.value) and str(refused.value).count("tools:") == 1
    # (a ref inside data is data; the rest written out, its definitions dropped)
    assert arguments_schema({"name": "f", "parameters": {"$defs": {"A": {"type": "string"}}, "type": "object",
                                                         "properties": {"a": {"$ref": "#/$defs/A", "default": "x"},
                                                                        "b": {"const": {"$ref": "#/$defs/A"}}}}}) == {
        "type": "object", "properties": {"a": {"type": "string", "default": "x"}, "b": {"const": {"$ref": "#/$defs/A"}}}}


# ---- serve, through the real clients


def hermes_server(folder: Path, tiny, **popen) -> ServerProcess:
    """A tiny model whose template offers tools the Hermes way, drafted for by the same weights."""
    model = write_tiny_model(folder / "hermes.gguf", TinySpec(seed=1, sharpness=2.0, chat_template=HERMES))
    return ServerProcess(folder, model, "--draft", tiny["same"], "--spec", "fixed", "--p-min", "0", "--temp", "0",
                         "-c", "1024", "--alias", "tiny", **popen)


tool_server = serving(lambda folder, request: hermes_server(folder, request.getfixturevalue("tiny")))


ASK = [{"role": "user", "content": "the weather in paris"}]


def test_openai_tool_calls_whole_and_streamed_and_the_round_trip(tool_server):
    client = tool_server.client()
    whole = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], tool_choice="required",
                                           max_tokens=120)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments)["city"] in ("paris", "tokyo")
    assert whole.model_extra["speculation"]["draft_tokens"] > 0

    chunks = list(client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], max_tokens=120,
                                                 tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                                 stream=True))
    deltas = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert [[(d.index, d.function.name, d.function.arguments) for d in delta] for delta in deltas] == [
        [(0, "get_weather", call.function.arguments)]]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    history = ASK + [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "clear"}'}]
    after = client.chat.completions.create(model="tiny", messages=history, tools=[WEATHER], tool_choice="none",
                                           max_tokens=8)
    assert after.choices[0].finish_reason == "length" and after.choices[0].message.content
    assert after.choices[0].message.tool_calls is None


def test_a_pydantic_models_tool_through_openais_client_is_called_to_its_schema(tool_server):
    """openai.pydantic_function_tool writes a nested model's schema with `$defs` and `$ref`s (the Agents SDK's and
    FastMCP's tools alike): a 400, "Error resolving ref", until refs were written out."""
    from typing import Literal

    import pydantic

    class Item(pydantic.BaseModel):
        sku: Literal["a1", "b2"]  # (a random model's free text runs to max_tokens)
        count: int

    class Order(pydantic.BaseModel):
        item: Item
        note: Literal["fragile"] | None = None

    tool = openai.pydantic_function_tool(Order)
    assert "$defs" in tool["function"]["parameters"]
    answer = tool_server.client().chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "order one"}], tools=[tool], tool_choice="required",
        max_tokens=200)
    [call] = answer.choices[0].message.tool_calls
    assert call.function.name == "Order" and Order.model_validate_json(call.function.arguments)


def test_a_predictions_tool_call_is_the_sdks_start_and_end_of_the_call_then_success(tool_server):
    """What the SDK's act() reads of a called tool: its name and arguments as an object, the round ended by it."""
    socket = raw_socket(tool_server)
    try:
        assert json.loads(socket.recv()) == {"success": True}
        config = {"fields": [{"key": "llm.prediction.tools", "value": {"type": "toolArray", "tools": [WEATHER],
                                                                        "force": True}},
                             {"key": "llm.prediction.maxPredictedTokens", "value": {"checked": True, "value": 120}}]}
        socket.send(json.dumps({"type": "channelCreate", "endpoint": "predict", "channelId": 1, "creationParameter": {
            "modelSpecifier": {"type": "query", "query": {"identifier": "tiny"}},
            "history": {"messages": [{"role": "user", "content": [{"type": "text", "text": ASK[0]["content"]}]}]},
            "predictionConfigStack": {"layers": [{"layerName": "apiOverride", "config": config}]}}}))
        sent = []
        while not sent or sent[-1]["type"] != "success":
            message = json.loads(socket.recv())
            assert message["type"] == "channelSend" and message["channelId"] == 1, message
            sent.append(message["message"])
    finally:
        socket.close()
    # (the call's tokens counted by a fragment without text: the call's text is no answer's)
    kinds = [message["type"] for message in sent if message.get("fragment", {}).get("content") != ""]
    assert kinds[-3:] == ["toolCallGenerationStart", "toolCallGenerationEnd", "success"], kinds
    assert sum(message["fragment"]["tokensCount"] for message in sent if message["type"] == "fragment") == sent[-1][
        "stats"]["predictedTokensCount"]
    [started] = [message for message in sent if message["type"] == "toolCallGenerationStart"]
    [called] = [message["toolCallRequest"] for message in sent if message["type"] == "toolCallGenerationEnd"]
    assert called["name"] == "get_weather" and called["arguments"]["city"] in ("paris", "tokyo")
    assert called["id"] == started["toolCallId"]
    assert sent[-1]["stats"]["stopReason"] == "toolCalls"


@pytest.mark.parametrize("fields, code, message", [
    ({"max_tokens": 6, "tool_choice": "required"}, "tool_call_unfinished", "ended inside a tool call"),
    ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}}, None, "not one of the tools"),
    ({"tools": [{**WEATHER, "function": {**WEATHER["function"], "description": "ends</s>"}}]}, None, "control token"),
    ({"response_format": {"type": "json_object"}, "tool_choice": "required"}, None, "both constrain"),
    ({"messages": ASK + [{"role": "assistant", "tool_calls": [{"id": "1", "type": "function", "function": {
        "name": "get_weather", "arguments": "{oops"}}]}]}, None, "not a JSON object"),
])
def test_bad_tool_requests_and_a_call_cut_off_are_one_error_and_serving_goes_on(tool_server, fields, code, message):
    client = tool_server.client()
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(**{"model": "tiny", "messages": ASK, "tools": [WEATHER], **fields})
    assert message in raised.value.message and (code is None or raised.value.code == code)
    assert client.chat.completions.create(model="tiny", messages=ASK, max_tokens=4).choices[0].message.content
    assert "Traceback" not in tool_server.log()


def test_a_streamed_call_cut_off_ends_its_stream_with_the_error(tool_server):
    stream = tool_server.client().chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], max_tokens=20,
                                                          tool_choice="required", stream=True)
    with pytest.raises(openai.APIError, match="ended inside a tool call"):
        for chunk in stream:
            assert not chunk.choices or not chunk.choices[0].delta.tool_calls


def test_a_model_whose_template_has_no_tools_says_so(tiny, tmp_path):
    running = ServerProcess(tmp_path, tiny["target"], "--temp", "0", "-c", "512", "--alias", "tiny")
    try:
        with pytest.raises(openai.BadRequestError, match="chat template has no tools"):
            running.client().chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER])
    finally:
        assert running.stop() == 0


@pytest.mark.parametrize("family", ["qwen3.5", "glm4.5", "gemma4", "minimax-m2", "kimi-k2", "seed-oss", "apriel",
                                    "nemotron-nano-v2", "command-r7b", "deepseek-v3.2", "deepseek-v4", "minicpm5",
                                    "apertus", "granite-3.3", "gigachat3", "gigachat3.1", "functionary-v3.1",
                                    "firefunction-v2", "functionary-v3.2", "kimi-k3", "minimax-m1", "hy3",
                                    "deepseek-r1-tools", "solar-open", "muse-glimmer", "minimax-m3",
                                    "ministral-3", "deepseek-v3.1"])
def test_qwen35s_glms_and_gemma4s_calls_come_back_as_openais_and_go_back_through_their_templates(
        thinkers, tmp_path, family):
    """Qwen3.5's <function=...> XML and Gemma 4's <|tool_call>call: (refused before: "does not read yet") and
    GLM-4.5's <arg_key> tags (read as hermes' JSON before), with each family's own template: a required call
    comes back as OpenAI's tool_calls, its arguments typed by the schema, and the round trip renders it back
    in the family's form."""
    # (their long preambles, in the tiny model's letters)
    context = "8192" if family in ("command-r7b", "gigachat3", "gigachat3.1", "muse-glimmer") else "2048"
    running = ServerProcess(tmp_path, thinkers[family], "--temp", "0", "-c", context, "--alias", "tiny")
    try:
        client = running.client()
        # (one call: a random model allowed several never stops calling)
        asked = {"model": "tiny", "messages": ASK, "tools": [WEATHER], "tool_choice": "required",
                 "parallel_tool_calls": False, "max_tokens": 400}
        whole = client.chat.completions.create(**asked)
        choice = whole.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        [call] = choice.message.tool_calls
        arguments = json.loads(call.function.arguments)
        assert call.function.name == "get_weather" and arguments["city"] in ("paris", "tokyo")
        assert type(arguments["days"]) is int
        streamed = list(client.chat.completions.create(**asked, stream=True))
        deltas = [d for c in streamed if c.choices and c.choices[0].delta.tool_calls for d in c.choices[0].delta.tool_calls]
        # (the same call, but for a near-tie among the random model's digits that a batched step may break otherwise)
        [delta] = deltas
        assert delta.function.name == "get_weather" and json.loads(delta.function.arguments).keys() == arguments.keys()
        history = ASK + [choice.message.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "clear"}'}]
        after = client.chat.completions.create(model="tiny", messages=history, tools=[WEATHER], tool_choice="none",
                                               max_tokens=4)
        assert after.choices[0].message.tool_calls is None
        counted = httpx.post(running.url + "/chat/completions/input_tokens", timeout=60,
                             json={"model": "tiny", "messages": history, "tools": [WEATHER], "tool_choice": "none"}
                             ).json()["input_tokens"]
        assert counted == after.usage.prompt_tokens
    finally:
        assert running.stop() == 0, running.log()
    assert "Traceback" not in running.log()


def required_weather_call(client) -> tuple:
    """A call of get_weather, required (one: a random model allowed several never stops calling), checked to
    be the tool's with typed arguments: the call, its arguments, and the conversation with it and its result."""
    choice = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], tool_choice="required",
                                            parallel_tool_calls=False, max_tokens=400).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls
    arguments = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and arguments["city"] in ("paris", "tokyo")
    assert type(arguments["days"]) is int
    return call, arguments, ASK + [choice.message.model_dump(exclude_none=True),
                                   {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "clear"}'}]


def test_a_chat_template_given_on_the_command_line_stands_for_the_models_own(tiny, tmp_path):
    """llama.cpp's --chat-template-file (and --jinja, which changes nothing here): a GGUF whose template has no
    tools is given one that has, as a model's makers publish fixed templates; its tools then work, and
    /props and /apply-template show it."""
    fixed = tmp_path / "fixed.jinja"
    fixed.write_text(HERMES)
    running = ServerProcess(tmp_path, tiny["target"], "--temp", "0", "-c", "512", "--alias", "tiny", "--jinja",
                            "--chat-template-file", str(fixed))
    try:
        call, arguments, history = required_weather_call(running.client())
        assert httpx.get(running.base + "/props", timeout=60).json()["chat_template"] == HERMES
        shown = ollama.Client(host=running.base).show("tiny")  # (what Ollama's clients decide to offer tools by)
        assert shown.template == HERMES and "tools" in shown.capabilities
        prompt = httpx.post(running.base + "/apply-template", timeout=60, json={"messages": history}).json()["prompt"]
        assert f'"days": {arguments["days"]}}}}}</tool_call>' in prompt and prompt.endswith("assistant:")
    finally:
        assert running.stop() == 0, running.log()
    assert "Traceback" not in running.log()


def test_mistrals_args_calls_are_read_where_their_markers_are_control_tokens(tmp_path):
    """Mistral Small 3.2's [TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...} (refused before: "does not read yet"), with its
    real template and its markers control tokens, as in its GGUFs: generated text leaves those out, so the
    session writes them in for the reader; the call comes back as OpenAI's, with the nine-character id its
    template insists on, and goes back through the template."""
    model = write_tiny_model(tmp_path / "mistral.gguf", TinySpec(
        seed=1, sharpness=2.0, chat_template=TEMPLATES[ToolFormat.MISTRAL_ARGS],
        control=("[TOOL_CALLS]", "[CALL_ID]", "[ARGS]", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]")))
    running = ServerProcess(tmp_path, model, "--temp", "0", "-c", "4096", "--alias", "tiny")  # (its long system prompt)
    try:
        client = running.client()
        call, arguments, history = required_weather_call(client)
        assert len(call.id) == 9 and call.id.isalnum()
        after = client.chat.completions.create(model="tiny", messages=history, tools=[WEATHER], tool_choice="none",
                                               max_tokens=4)
        assert after.choices[0].message.tool_calls is None
    finally:
        assert running.stop() == 0, running.log()
    assert "Traceback" not in running.log()


def test_a_files_tool_use_template_renders_the_prompts_that_offer_tools(tmp_path):
    """Hermes 2 Pro's and 3's GGUFs (and Cohere's) carry a template of their own for tools beside one without: a
    request with tools is rendered with it, as llama.cpp does (a 400 "has no tools" before), one without with the
    file's own; Ollama's show counts tools among its capabilities."""
    chatml = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
              "<|im_start|>assistant\n")
    model = write_tiny_model(tmp_path / "hermes.gguf", TinySpec(seed=1, sharpness=2.0, chat_template=[
        {"name": "default", "template": chatml},
        {"name": "tool_use", "template": (REAL / "hermes-2-pro-tool_use.jinja").read_text()}],
        control=("<|im_start|>", "<|im_end|>")))
    running = ServerProcess(tmp_path, model, "--temp", "0", "-c", "4096", "--alias", "tiny")
    try:
        client = running.client()
        call, arguments, history = required_weather_call(client)
        after = client.chat.completions.create(model="tiny", messages=history, tools=[WEATHER], tool_choice="none",
                                               max_tokens=4)
        assert after.choices[0].message.tool_calls is None
        plain = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=4)
        offered = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], tool_choice="none",
                                                 max_tokens=4)
        assert 4 * plain.usage.prompt_tokens < offered.usage.prompt_tokens  # (the tools' system prompt)
        assert "tools" in ollama.Client(host=running.base).show("tiny").capabilities
        props = httpx.get(running.base + "/props", timeout=60).json()  # (as llama-server shows both)
        assert props["chat_template"] == chatml and "<tool_call>" in props["chat_template_tool_use"]
    finally:
        assert running.stop() == 0, running.log()
    assert "Traceback" not in running.log()


def test_lfm2s_python_style_calls_come_back_as_openais_and_are_written_back_for_its_template(tmp_path):
    """LFM2's `<|tool_call_start|>[NAME(key=value)]<|tool_call_end|>` (refused before: "does not read yet"), with
    its real template and its markers control tokens: a required call comes back as OpenAI's, typed, and the
    round trip writes it back after the assistant's content as the model wrote it (its template writes the
    content alone: the model read an empty turn before its call's result), the markers as control tokens."""
    model = write_tiny_model(tmp_path / "lfm2.gguf", TinySpec(
        seed=1, sharpness=2.0, chat_template=TEMPLATES[ToolFormat.LFM2],
        control=("<|tool_call_start|>", "<|tool_call_end|>", "<|tool_list_start|>", "<|tool_list_end|>",
                 "<|tool_response_start|>", "<|tool_response_end|>", "<|im_start|>", "<|im_end|>")))
    running = ServerProcess(tmp_path, model, "--temp", "0", "-c", "2048", "--alias", "tiny")
    try:
        client = running.client()
        call, arguments, history = required_weather_call(client)
        prompt = httpx.post(running.base + "/apply-template", timeout=60,
                            json={"model": "tiny", "messages": history, "tools": [WEATHER]}).json()["prompt"]
        written = f'<|tool_call_start|>[get_weather(city="{arguments["city"]}", days={arguments["days"]})]<|tool_call_end|>'
        # (the tiny vocabulary shows a space after each control token's text)
        assert f"<|im_start|>assistant\n{written}<|im_end|>" in prompt.replace("|> ", "|>"), prompt
        tokens = httpx.post(running.base + "/tokenize", timeout=60, json={"content": written, "parse_special": True,
                                                                          "with_pieces": True}).json()["tokens"]
        assert tokens[0]["piece"] == "<|tool_call_start|>"  # (one control token, as the template's own text)
        after = client.chat.completions.create(model="tiny", messages=history, tools=[WEATHER], tool_choice="none",
                                               max_tokens=4)
        counted = httpx.post(running.url + "/chat/completions/input_tokens", timeout=60,
                             json={"model": "tiny", "messages": history, "tools": [WEATHER]}).json()["input_tokens"]
        assert counted == after.usage.prompt_tokens
    finally:
        assert running.stop() == 0, running.log()
    assert "Traceback" not in running.log()
    with closing(Model(model)) as loaded:
        marker = loaded.tokenize("<|tool_call_start|>", add_special=False, parse_special=True)
        history[1]["tool_calls"][0]["function"]["arguments"] = arguments  # (as the protocols hand it on)
        assert len(marker) == 1 and marker[0] in Prompts(loaded, 2048).chat_tokens(history)


def test_granite_3s_earlier_calls_are_written_back_after_the_assistants_content(thinkers):
    """Granite 3.3's template writes an assistant's content alone: its calls are written after it as the model writes
    them, <|tool_call|> (one control token) and the JSON list, so that the model reads the call its result answers."""
    with closing(Model(thinkers["granite-3.3"])) as loaded:
        tokens = Prompts(loaded, 2048).chat_tokens(called({"city": "paris"}))
        marker = loaded.tokenize("<|tool_call|>", add_special=False, parse_special=True)
        assert len(marker) == 1 and marker[0] in tokens
        text = loaded.spell_of(tokens, special=True).decode().replace("|> ", "|>")
        assert '<|end_of_role|><|tool_call|>[{"name": "get_weather", "arguments": {"city": "paris"}}]<|end_of_text|>' \
            in text, text


def test_firefunctions_template_reads_the_tools_as_functions_and_chats_without_any(thinkers):
    """Firefunction v2's template reads the tools as `functions`, their definitions' JSON text, and today's date as
    `datetime` (llama.cpp's spelling), tools or not: it failed on every chat before ("'functions' is undefined")."""
    from datetime import datetime
    with closing(Model(thinkers["firefunction-v2"])) as loaded:
        prompts = Prompts(loaded, 2048)
        offered = loaded.spell_of(prompts.chat_tokens(ASK, Tools((WEATHER,))), special=True).decode()
        assert '"name": "get_weather"' in offered and f"Today is {datetime.now():%b %d %Y}." in offered, offered
        alone = loaded.spell_of(prompts.chat_tokens(ASK), special=True).decode()
        assert "Available functions as JSON spec:\n[]" in alone and "get_weather" not in alone


def test_deepseek_v31s_tools_are_described_in_its_system_prompt_as_its_model_card_has_them(thinkers):
    """DeepSeek V3.1's template writes calls but no tools (its model card has the application describe them in the
    system prompt): a request with tools was a 400, "has no tools". They are described now, after the client's
    system message, the form's markers control tokens (the template's own text, not a message's)."""
    with closing(Model(thinkers["deepseek-v3.1"])) as loaded:
        prompts = Prompts(loaded, 4096)
        system = [{"role": "system", "content": "Be brief."}]
        tokens = prompts.chat_tokens(system + ASK, Tools((WEATHER,)))
        offered = loaded.spell_of(tokens, special=True).decode()
        assert "### get_weather\nDescription: The weather in a city\n\nParameters: {" in offered
        assert offered.index("Be brief.") < offered.index("## Tools") < offered.index("<｜User｜>")
        opening = loaded.tokenize("<｜tool▁calls▁begin｜>", add_special=False, parse_special=True)
        assert len(opening) == 1 and opening[0] in tokens  # (a control token, as the model was taught)
        assert "## Tools" not in loaded.spell_of(prompts.chat_tokens(system + ASK), special=True).decode()


def test_another_models_call_ids_are_written_as_the_nine_characters_mistrals_template_takes(tmp_path):
    """Mistral's templates refuse any call id but nine letters and digits: a conversation begun with another model
    (`call_...`, Anthropic's `toolu_...`) and gone on with Mistral was a 400. Each foreign id is written as nine of
    its own now, the same for the call and its result; the model's own are kept."""
    model = write_tiny_model(tmp_path / "mistral.gguf", TinySpec(
        seed=1, sharpness=2.0, chat_template=TEMPLATES[ToolFormat.MISTRAL_ARGS],
        control=("[TOOL_CALLS]", "[CALL_ID]", "[ARGS]", "[INST]", "[/INST]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]")))
    calls = [{"id": given, "type": "function", "function": {"name": "get_weather", "arguments": {"city": "paris"}}}
             for given in ("call_9f2b6c1d", "toolu_01AbC", "Ab3dE6gH9")]
    history = [*ASK, {"role": "assistant", "content": "", "tool_calls": calls},
               *({"role": "tool", "tool_call_id": call["id"], "content": "sun"} for call in calls)]
    with closing(Model(model)) as loaded:
        written = loaded.spell_of(Prompts(loaded, 4096).chat_tokens(history, Tools((WEATHER,))), special=True).decode()
    ids = re.findall(r"\[CALL_ID\]\s*(\w+)", written)
    assert len(ids) == 3 and ids[2] == "Ab3dE6gH9" and all(re.fullmatch(r"[A-Za-z0-9]{9}", i) for i in ids), written
    assert len(set(ids)) == 3 and all(written.count(i) == 2 for i in ids)  # (each call's, and its result's)


def test_another_models_calls_made_together_are_written_one_a_turn_for_llama_3(tmp_path):
    """Llama 3.1's to 3.3's templates refuse an assistant's message of several calls ("This model only supports single
    tool-calls at once!"): a conversation begun with a model that calls tools together was a 400. Each call is a
    message of its own now, followed by its result."""
    model = write_tiny_model(tmp_path / "llama.gguf", TinySpec(
        seed=1, sharpness=2.0, chat_template=(REAL / "llama-3.1.jinja").read_text(),
        control=("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>")))
    calls = [{"id": f"call_{city}", "type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}
             for city in ("paris", "tokyo")]
    history = [*ASK, {"role": "assistant", "content": "", "tool_calls": calls},
               {"role": "tool", "tool_call_id": "call_tokyo", "content": "rain"},
               {"role": "tool", "tool_call_id": "call_paris", "content": "sun"}]
    with closing(Model(model)) as loaded:
        written = "".join(loaded.spell_of(Prompts(loaded, 4096).chat_tokens(history, Tools((WEATHER,))),
                                          special=True).decode().split())
    assert re.search(r'"city":"paris"}}<\|eot_id\|><\|start_header_id\|>ipython<\|end_header_id\|>"?sun.*'
                     r'"city":"tokyo"}}<\|eot_id\|><\|start_header_id\|>ipython<\|end_header_id\|>"?rain', written), written


def test_functionary_v32_is_given_its_contents_recipient_where_no_tool_may_be_called(thinkers):
    """Functionary v3.2's prompt ends `>>>`, leaving the recipient to the model: without tools on offer (or with
    tool_choice none) the prompt names `all`, its content's, as its template writes an assistant's content (the
    answer began `all` and a newline before); with tools the model names it."""
    from localspec.request import Request
    with closing(Model(thinkers["functionary-v3.2"])) as loaded:
        prompts = Prompts(loaded, 2048)
        for tools, ending in ((None, ">>>all\n"), (Tools((WEATHER,), choice="none"), ">>>all\n"),
                             (Tools((WEATHER,)), ">>>"), (Tools((WEATHER,), choice="required"), ">>>")):
            prepared = prompts.prepare(Request(messages=ASK, tools=tools))
            assert loaded.spell_of(prepared.tokens, special=True).decode().endswith(ending), tools
            # (its reply then read as content alone: its first line is no recipient's name)
            assert (prepared.tool_format is None) == ending.endswith("\n")


def called(arguments) -> list[dict]:
    """ASK, a call of get_weather with these arguments (an object, or JSON text as OpenAI's messages carry it), and
    its result."""
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    return [*ASK, {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sun"}]


def test_an_earlier_calls_arguments_as_json_text_are_written_as_the_object_they_are(tmp_path):
    """OpenAI's messages (and a ToolCall) carry a call's arguments as JSON text; the protocols hand them on as
    objects, the library as they came: a template's tojson then wrote them as one quoted string."""
    model = write_tiny_model(tmp_path / "hermes.gguf", TinySpec(seed=1, chat_template=HERMES))
    history, as_text = called({"city": "paris"}), called('{"city": "paris"}')
    with closing(Model(model)) as loaded:
        prompts = Prompts(loaded, 2048)
        assert prompts.chat_tokens(as_text) == prompts.chat_tokens(history)
        # arguments that are no JSON object are written as they came
        assert prompts.chat_tokens(called("paris")) != prompts.chat_tokens(history)


def test_an_earlier_calls_arguments_reach_a_template_that_joins_them_to_text_as_text(tmp_path):
    """DeepSeek's templates join a call's arguments to their own strings: given as the object the protocols hand on,
    the whole request failed ("can only concatenate str (not "dict") to str"). Found by writing a call both ways,
    as llama.cpp does; templates that write them with tojson still get the object."""
    joining = ("{% for m in messages %}{{ m.content }}{% for c in m.tool_calls or [] %}"
               "{{ '<call>' + c.function.name + ' ' + c.function.arguments + '</call>' }}{% endfor %}{% endfor %}")
    model = write_tiny_model(tmp_path / "joining.gguf", TinySpec(seed=1, chat_template=joining))
    history, as_text = called({"city": "paris"}), called('{"city": "paris"}')
    with closing(Model(model)) as loaded:
        prompts = Prompts(loaded, 2048)
        assert prompts.arguments_as_text
        assert prompts.chat_tokens(history) == prompts.chat_tokens(as_text) == loaded.tokenize(
            render(joining, as_text, "", ""), True, True)
    with closing(Model(write_tiny_model(tmp_path / "hermes.gguf", TinySpec(seed=1, chat_template=HERMES)))) as loaded:
        assert not Prompts(loaded, 2048).arguments_as_text


def test_lfm2s_grammar_takes_values_as_json_or_as_its_template_writes_them(target):
    """LFM2.5's template writes an earlier call's strings between single quotes and its booleans as Python
    does: the grammar takes those as well as JSON's, and the reader reads both the same."""
    flag = {"type": "function", "function": {"name": "flag", "parameters": {"type": "object", "properties": {
        "on": {"type": "boolean"}, "text": {"type": "string"}}, "required": ["on"]}}}
    tools = Tools((CLOCK, NOTE, flag), choice="required")
    gbnf, _ = constraint(ToolFormat.LFM2, tools)
    for text, called in [("<|tool_call_start|>[get_time(zone='cet')]<|tool_call_end|>", ("get_time", {"zone": "cet"})),
                         ("<|tool_call_start|>[note(text='it\\'s 5')]<|tool_call_end|>", ("note", {"text": "it's 5"})),
                         ('<|tool_call_start|>[note(text="a\\nb")]<|tool_call_end|>', ("note", {"text": "a\nb"})),
                         ("<|tool_call_start|>[flag(on=True, text='x')]<|tool_call_end|>", ("flag", {"on": True, "text": "x"})),
                         ("<|tool_call_start|>[flag(on=false)]<|tool_call_end|>", ("flag", {"on": False}))]:
        with Grammar(target.model, gbnf) as grammar:
            for token in tokens_of(target, text):
                grammar.accept(token)  # (an InputError where the grammar does not admit it)
        reader = ToolStream(ToolFormat.LFM2, required=True, tools=tools)
        [call] = reader.feed(text) + reader.end()
        assert (call.name, call.argument_values) == called
    with Grammar(target.model, gbnf) as grammar, pytest.raises(InputError, match="does not admit"):
        for token in tokens_of(target, "<|tool_call_start|>[get_time(zone='gmt')"):
            grammar.accept(token)


def test_ollama_chat_takes_tools_and_a_tool_history(tool_server):
    client = ollama.Client(host=tool_server.base)
    history = ASK + [{"role": "assistant", "content": "", "tool_calls": [
                         {"function": {"name": "get_weather", "arguments": {"city": "paris", "days": 1}}}]},
                     {"role": "tool", "content": '{"sky": "clear"}', "tool_name": "get_weather"}]
    answer = client.chat("tiny", messages=history, tools=[WEATHER], options={"num_predict": 8})
    assert answer.done and answer.message.role == "assistant"
    assert "tools" in client.show("tiny").capabilities


CITY_WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a given city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city name"}},
                   "required": ["city"]}}}


@pytest.mark.slow
def test_real_qwen_calls_a_tool_reads_its_result_and_answers_through_both_clients(real_model, tmp_path):
    running = ServerProcess(tmp_path, real_model("qwen2.5-coder-0.5b"), "--temp", "0", "-c", "2048", "--alias", "qwen")
    try:
        client = running.client()
        ask = [{"role": "system", "content": "You are a helpful assistant."},
               {"role": "user", "content": "What is the weather like in Paris today?"}]
        first = client.chat.completions.create(model="qwen", messages=ask, tools=[CITY_WEATHER], max_tokens=100)
        assert first.choices[0].finish_reason == "tool_calls", first.choices[0].message
        [call] = first.choices[0].message.tool_calls
        assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}

        streamed = client.chat.completions.create(model="qwen", messages=ask, tools=[CITY_WEATHER], max_tokens=100,
                                                  stream=True)
        calls = [d for c in streamed if c.choices and c.choices[0].delta.tool_calls for d in c.choices[0].delta.tool_calls]
        assert [(d.function.name, d.function.arguments) for d in calls] == [("get_weather", call.function.arguments)]

        history = ask + [first.choices[0].message.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 18, "sky": "cloudy"}'}]
        answer = client.chat.completions.create(model="qwen", messages=history, tools=[CITY_WEATHER], max_tokens=60,
                                                tool_choice="none")
        assert answer.choices[0].finish_reason == "stop" and "18" in answer.choices[0].message.content, answer

        chat = ollama.Client(host=running.base).chat("qwen", messages=ask, tools=[CITY_WEATHER])
        assert [(c.function.name, c.function.arguments) for c in chat.message.tool_calls] == [
            ("get_weather", {"city": "Paris"})]

        # LM Studio's SDK: act() calls the function the model named with its arguments, and answers from its result
        asked = []

        def get_weather(city: str) -> dict:
            """Get the current weather in a given city"""
            asked.append(city)
            return {"temperature_c": 18, "sky": "cloudy"}

        with lms.Client(running.base.removeprefix("http://")) as sdk:
            said = []
            acted = sdk.llm.model("qwen").act(lms.Chat.from_history({"messages": ask}), [get_weather],
                                              on_message=said.append, config={"maxTokens": 100},
                                              max_prediction_rounds=2)  # (the last without tools, as tool_choice none)
        assert asked == ["Paris"] and acted.rounds == 2 and "18" in said[-1].content[0].text, said
    finally:
        assert running.stop() == 0, running.log()


def test_a_functions_arguments_are_an_object_where_its_parameters_say_no_type():
    """A schema of annotations alone admits any value (as JSON Schema says), but a call's arguments are an object:
    parameters that give a description alone hold the arguments to an object all the same. A function offered with
    no parameters takes none, as OpenAI's API says (its calls were held to any object: f({"city": "Paris"}))."""
    assert arguments_schema({"name": "f"}) == {"type": "object", "properties": {}, "additionalProperties": False}
    none, _ = constraint(ToolFormat.HERMES, Tools(({"type": "function", "function": {"name": "f"}},), choice="required"))
    assert re.search(r'\ncall-arguments ::= "\{" space +"\}" space\n', none), none
    assert arguments_schema({"name": "f", "parameters": {"description": "anything"}}) == {
        "description": "anything", "type": "object"}
    given = {"type": "object", "properties": {"a": {"type": "string"}}}
    untyped = {"properties": {"a": {"type": "string"}}}  # (MCP servers often leave the type out: kept as it is)
    assert arguments_schema({"parameters": given}) == given and arguments_schema({"parameters": untyped}) == untyped
    grammar, _ = constraint(ToolFormat.HERMES, Tools(({"type": "function", "function": {
        "name": "f", "parameters": {"description": "anything"}}},), choice="required"))
    assert "\ncall-arguments ::= object\n" in grammar
