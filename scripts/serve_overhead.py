#!/usr/bin/env python3
"""What serving costs: the same greedy generation run in this process through a Session, and through
`localspec serve` (streamed and not) with the openai client, streamed through OpenAI's Responses API and
(with the anthropic client) Anthropic's Messages API, alternating, never at the same time.

    .venv/bin/python scripts/serve_overhead.py smollm2-135m --rounds 5 --max-tokens 256 [--first-rounds 40]

Prints tokens/s for each way (the server's from the client's clock: first to last streamed text, or
the whole request) and the server's own `predicted_per_second`, and the time from sending a streamed
request to its first text (chat completions against Messages and Responses, through each protocol's
client and read as bare lines), as medians over the rounds.
"""

import argparse
import statistics
import subprocess
import sys
import time

import anthropic
import httpx2 as httpx
import openai

from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation
from localspec.request import Request
from localspec.session import open_session
from localspec.stats import record

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--first-rounds", type=int, default=40, help="short requests to each API, in turns, whose"
                        " first text is timed read as bare lines (default: 40)")
    args = parser.parse_args()

    server = subprocess.Popen([sys.executable, "-m", "localspec", "serve", args.model, "--no-draft", "--temp", "0",
                               "--port", "0", "--offline"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True)
    try:
        url = server.stdout.readline().split(" on ")[1].split()[0]
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)
        raw = httpx.Client(timeout=600)  # one connection kept, as the clients keep theirs
        messages_client = anthropic.Anthropic(base_url=url.removesuffix("/v1"), api_key="unused", max_retries=0,
                                              timeout=600)
        messages = [{"role": "user", "content": PROMPT}]
        runtime, speculation = Runtime(), Speculation(drafting=DrafterKind.PLAIN)
        rates: dict[str, list[float]] = {"in process": [], "served, streamed": [], "served, streamed, raw SSE": [],
                                         "served, whole": [], "served, streamed, Anthropic's Messages": [],
                                         "served, streamed, OpenAI's Responses": [],
                                         "server's predicted_per_second": []}
        first: dict[str, list[float]] = {"chat completions": [], "Anthropic's Messages": [], "OpenAI's Responses": [],
                                         "chat completions, raw SSE": [], "Anthropic's Messages, raw SSE": [],
                                         "OpenAI's Responses, raw SSE": []}
        # the first text of a short answer read as bare lines, the two APIs in turns many times: one
        # request's first text moves by a fifth from run to run on two shared cores
        with open_session(args.model, None, runtime, speculation, offline=True) as session:
            tokens = session.prompts.chat_tokens(messages)
            for round_ in range(args.rounds):
                session.reset()
                recorder = record(session.generate(Request(Sampling(temperature=0), Limits(args.max_tokens), prompt=tokens)))
                rates["in process"].append(recorder.tokens / recorder.decode_seconds)

                def chat_streamed() -> None:
                    stamps, count, started = [], 0, time.perf_counter()
                    for chunk in client.chat.completions.create(model=args.model, messages=messages, stream=True,
                                                                max_tokens=args.max_tokens,
                                                                stream_options={"include_usage": True}):
                        if chunk.choices and chunk.choices[0].delta.content:
                            stamps.append(time.perf_counter())
                        if chunk.usage:
                            count = chunk.usage.completion_tokens
                            rates["server's predicted_per_second"].append(chunk.timings["predicted_per_second"])
                    # from the first text to the last: count - 1 tokens came in that span
                    rates["served, streamed"].append((count - 1) / (stamps[-1] - stamps[0]))
                    first["chat completions"].append(stamps[0] - started)

                def messages_streamed() -> None:
                    started = time.perf_counter()
                    with messages_client.messages.stream(model=args.model, max_tokens=args.max_tokens,
                                                         messages=messages) as stream:
                        stamps = [time.perf_counter() for _ in stream.text_stream]
                        count = stream.get_final_message().usage.output_tokens
                    rates["served, streamed, Anthropic's Messages"].append((count - 1) / (stamps[-1] - stamps[0]))
                    first["Anthropic's Messages"].append(stamps[0] - started)

                def responses_streamed() -> None:
                    stamps, count, started = [], 0, time.perf_counter()
                    for event in client.responses.create(model=args.model, input=PROMPT, stream=True,
                                                         max_output_tokens=args.max_tokens):
                        if event.type == "response.output_text.delta":
                            stamps.append(time.perf_counter())
                        elif event.type in ("response.completed", "response.incomplete"):
                            count = event.response.usage.output_tokens
                    rates["served, streamed, OpenAI's Responses"].append((count - 1) / (stamps[-1] - stamps[0]))
                    first["OpenAI's Responses"].append(stamps[0] - started)

                # the same stream read as bare lines: a client's own parsing per event runs on this
                # machine's cores too
                body = {"model": args.model, "messages": messages, "max_tokens": args.max_tokens, "stream": True}

                def chat_lines() -> None:
                    with raw.stream("POST", url + "/chat/completions", json=body) as response:
                        stamps = [time.perf_counter() for line in response.iter_lines() if '"content"' in line]
                    rates["served, streamed, raw SSE"].append((len(stamps) - 2) / (stamps[-1] - stamps[1]))

                # in turns, so that none always follows the same request
                for way in (chat_streamed, messages_streamed, responses_streamed, chat_lines)[:: 1 if round_ % 2 else -1]:
                    way()

                started = time.perf_counter()
                whole = client.chat.completions.create(model=args.model, messages=messages, max_tokens=args.max_tokens)
                seconds = time.perf_counter() - started - whole.timings["prompt_ms"] / 1e3
                rates["served, whole"].append(whole.usage.completion_tokens / seconds)
        short = {"model": args.model, "messages": messages, "max_tokens": 16, "stream": True}
        short_input = {"model": args.model, "input": PROMPT, "max_output_tokens": 16, "stream": True}
        for round_ in range(args.first_rounds):
            for way, path, body, marker, skip in [
                    ("chat completions, raw SSE", "/v1/chat/completions", short, '"content": "', 1),
                    ("Anthropic's Messages, raw SSE", "/v1/messages", short, '"text_delta"', 0),
                    ("OpenAI's Responses, raw SSE", "/v1/responses", short_input, '"response.output_text.delta"', 0),
            ][:: 1 if round_ % 2 else -1]:
                started = time.perf_counter()
                with raw.stream("POST", url.removesuffix("/v1") + path, json=body) as response:
                    stamps = [time.perf_counter() for line in response.iter_lines() if marker in line]
                first[way].append(stamps[skip] - started)  # (chat's first: the role's, no text)
        base = statistics.median(rates["in process"])
        print(f"{args.model}, greedy, {args.max_tokens} tokens, {args.rounds} rounds (medians):")
        for way, values in rates.items():
            median = statistics.median(values)
            print(f"  {way:40} {median:7.1f} tok/s  {median / base:5.3f}x")
        for way, values in first.items():  # each against chat completions read the same way
            median = statistics.median(values)
            chat = statistics.median(first["chat completions" + (", raw SSE" if "raw" in way else "")])
            print(f"  first text, {way:37} {median * 1e3:7.1f} ms {median / chat:5.3f}x")
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
