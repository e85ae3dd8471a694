"""The default demo target serving an editor's and an agent's ordinary requests, one after another on one
server, through the real `openai` and `ollama` clients, with speculation off, under auto and with a draft
model: each answers, and the server still answers /health after each (issue 46: the issue's own tool-call
request ended the whole process on the 1.5B, where the suite's tiny models and the 0.5B never showed it)."""

import json
from concurrent.futures import ThreadPoolExecutor

import httpx2 as httpx
import ollama
import pytest

from test_server import ServerProcess

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
CITY = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
        "required": ["city", "country"], "additionalProperties": False}
CODE = "def add(a, b):\n    return a + b\n"


def weather_call(client, **options):
    return client.chat.completions.create(model="coder", messages=ASK_WEATHER, tools=[WEATHER], max_tokens=96,
                                          temperature=0, **options)


@pytest.mark.slow
@pytest.mark.parametrize("speculation", [["--spec", "off"], [], ["--draft", "DRAFT", "--spec", "fixed"]],
                         ids=["off", "auto", "draft-model"])
def test_an_editors_and_an_agents_requests_one_after_another(real_model, tmp_path, speculation):
    target = real_model("qwen2.5-coder-1.5b")
    if "DRAFT" in speculation:
        speculation = [str(real_model("qwen2.5-coder-0.5b")) if arg == "DRAFT" else arg for arg in speculation]
    server = ServerProcess(tmp_path / "home", target, *speculation, "-c", "4096", "--alias", "coder")
    client = server.client()
    local = ollama.Client(host=server.base)

    def healthy():
        assert httpx.get(server.base + "/health", timeout=10).status_code == 200, server.log()

    try:
        said = client.chat.completions.create(model="coder", max_tokens=32, temperature=0, messages=[
            {"role": "user", "content": "Add type hints and return the code:\n\n" + CODE}])
        assert "def add(" in said.choices[0].message.content
        healthy()

        chunks = list(client.chat.completions.create(model="coder", max_tokens=24, stream=True, messages=[
            {"role": "user", "content": "Write a Python function that reverses a string."}]))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip()
        healthy()

        shaped = client.chat.completions.create(
            model="coder", max_tokens=48, temperature=0, messages=[{"role": "user", "content": "Where is Paris?"}],
            response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": CITY, "strict": True}})
        assert set(json.loads(shaped.choices[0].message.content)) == {"city", "country"}
        healthy()

        [call] = weather_call(client).choices[0].message.tool_calls  # the request that ended the process
        assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)
        healthy()
        [required] = weather_call(client, tool_choice="required", parallel_tool_calls=False).choices[0].message.tool_calls
        assert required.function.name == "get_weather"
        healthy()

        answered = client.chat.completions.create(model="coder", max_tokens=96, temperature=0, tools=[WEATHER], messages=[
            *ASK_WEATHER, {"role": "assistant", "content": None, "tool_calls": [
                {"id": call.id, "type": "function", "function": {"name": call.function.name,
                                                                 "arguments": call.function.arguments}}]},
            {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18, "sky": "clear"}'}])
        assert answered.choices[0].message.content or answered.choices[0].message.tool_calls  # (it may call again)
        healthy()

        vectors = client.embeddings.create(model="coder", input=["def add(a, b)", "a string reversed"]).data
        assert len(vectors) == 2 and len(vectors[0].embedding) == 1536  # Qwen2.5 1.5B's width
        healthy()

        parts = list(local.chat("coder", messages=ASK_WEATHER, tools=[WEATHER], stream=True,
                                options={"temperature": 0, "num_predict": 96}))
        assert parts[-1].done and any(part.message.tool_calls for part in parts)
        healthy()
        formatted = local.generate("coder", prompt="Name a city and its country as JSON.", format=CITY,
                                   options={"temperature": 0, "num_predict": 48})
        assert set(json.loads(formatted.response)) == {"city", "country"}
        assert len(local.embed("coder", input="def add(a, b)").embeddings[0]) == 1536
        healthy()

        with ThreadPoolExecutor(2) as pool:  # two clients at once: an agent's tool call beside a chat
            calling = pool.submit(weather_call, client)
            chatting = pool.submit(local.chat, "coder", messages=[{"role": "user", "content": "Say hello."}],
                                   options={"num_predict": 16})
            assert calling.result().choices[0].message.tool_calls and chatting.result().message.content
        healthy()
        assert "Traceback" not in server.log()
    finally:
        assert server.stop() == 0, server.log()


STARS = "root ::= " + " ".join(["[a-z]*"] * 40)  # one masked row of this took 49 s of uncancellable C work


@pytest.mark.slow
def test_a_grammar_that_would_take_minutes_a_step_is_one_400_and_the_server_goes_on(real_model, tmp_path):
    server = ServerProcess(tmp_path / "home", real_model("qwen2.5-coder-1.5b"), "--spec", "off", "--alias", "coder")
    client = server.client()
    local = ollama.Client(host=server.base)
    try:
        for ask in (lambda: client.chat.completions.create(model="coder", max_tokens=8, extra_body={"grammar": STARS},
                                                           messages=[{"role": "user", "content": "Say hi."}]),
                    lambda: local.generate("coder", prompt="Say hi.", options={"num_predict": 8},
                                           format={"type": "string", "pattern": "^" + "[a-z]*" * 40 + "$"})):
            with pytest.raises(Exception, match="would take over") as refused:
                ask()
            assert getattr(refused.value, "status_code", None) == 400
            assert httpx.get(server.base + "/health", timeout=10).status_code == 200, server.log()
        said = client.chat.completions.create(model="coder", max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
        assert said.choices[0].message.content
        assert "Traceback" not in server.log()
    finally:
        assert server.stop() == 0, server.log()
