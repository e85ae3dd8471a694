#!/usr/bin/env python3
"""What serving costs: the same greedy generation run in this process through a Session, and through
`localspec serve` (streamed and not) with the openai client, alternating, never at the same time.

    .venv/bin/python scripts/serve_overhead.py smollm2-135m --rounds 5 --max-tokens 256

Prints tokens/s for each way (the server's from the client's clock: first to last streamed text, or
the whole request) and the server's own `predicted_per_second`, as medians over the rounds.
"""

import argparse
import statistics
import subprocess
import sys
import time

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
    args = parser.parse_args()

    server = subprocess.Popen([sys.executable, "-m", "localspec", "serve", args.model, "--no-draft", "--temp", "0",
                               "--port", "0", "--offline"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True)
    try:
        url = server.stdout.readline().split(" on ")[1].split()[0]
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)
        messages = [{"role": "user", "content": PROMPT}]
        runtime, speculation = Runtime(), Speculation(drafting=DrafterKind.PLAIN)
        rates: dict[str, list[float]] = {"in process": [], "served, streamed": [], "served, streamed, raw SSE": [],
                                         "served, whole": [], "server's predicted_per_second": []}
        with open_session(args.model, None, runtime, speculation, offline=True) as session:
            tokens = session.prompts.chat_tokens(messages)
            for _ in range(args.rounds):
                session.reset()
                recorder = record(session.generate(Request(Sampling(temperature=0), Limits(args.max_tokens), prompt=tokens)))
                rates["in process"].append(recorder.tokens / recorder.decode_seconds)

                stamps, count = [], 0
                for chunk in client.chat.completions.create(model="m", messages=messages, max_tokens=args.max_tokens,
                                                            stream=True, stream_options={"include_usage": True}):
                    if chunk.choices and chunk.choices[0].delta.content:
                        stamps.append(time.perf_counter())
                    if chunk.usage:
                        count = chunk.usage.completion_tokens
                        rates["server's predicted_per_second"].append(chunk.timings["predicted_per_second"])
                # from the first text to the last: count - 1 tokens came in that span
                rates["served, streamed"].append((count - 1) / (stamps[-1] - stamps[0]))

                # the same stream read as bare lines: the openai client's own parsing per chunk runs on
                # this machine's cores too
                body = {"messages": messages, "max_tokens": args.max_tokens, "stream": True}
                with httpx.stream("POST", url + "/chat/completions", json=body, timeout=600) as response:
                    stamps = [time.perf_counter() for line in response.iter_lines() if '"content"' in line]
                rates["served, streamed, raw SSE"].append((len(stamps) - 2) / (stamps[-1] - stamps[1]))

                started = time.perf_counter()
                whole = client.chat.completions.create(model="m", messages=messages, max_tokens=args.max_tokens)
                seconds = time.perf_counter() - started - whole.timings["prompt_ms"] / 1e3
                rates["served, whole"].append(whole.usage.completion_tokens / seconds)
        base = statistics.median(rates["in process"])
        print(f"{args.model}, greedy, {args.max_tokens} tokens, {args.rounds} rounds (medians):")
        for way, values in rates.items():
            median = statistics.median(values)
            print(f"  {way:32} {median:7.1f} tok/s  {median / base:5.3f}x")
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
