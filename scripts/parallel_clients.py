#!/usr/bin/env python3
"""Several clients at once against `localspec serve -np N`: aggregate tokens/s of N concurrent streamed
requests against the same requests one at a time on the same server (interleaved rounds), and how long
the last-arriving client waits for its first token.

    .venv/bin/python scripts/parallel_clients.py qwen2.5-coder-1.5b --clients 4 --rounds 2 --max-tokens 64

Every request is a different MT-Bench question (no round repeats one, so no answer is drafted from an
earlier one's copy and no prompt is found cached), greedy, with the server's default drafting (--no-draft
for plain decoding). Prints per-round rates and the median ratio; a server with -np 1
given as --parallel 1 is the A/A control (the concurrent requests then queue).
"""

import argparse
import statistics
import subprocess
import sys
import threading
import time

import httpx2 as httpx

from localspec.bench import load_prompts



def stream(url: str, model: str, messages: list, max_tokens: int, out: dict) -> None:
    sent = time.perf_counter()
    stamps, usage = [], None
    body = {"model": model, "messages": messages, "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}, "temperature": 0}
    with httpx.Client(timeout=900) as client, client.stream("POST", url + "/chat/completions", json=body) as response:
        for line in response.iter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            chunk = __import__("json").loads(line[5:])
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                stamps.append(time.perf_counter())
            if chunk.get("usage"):
                usage = chunk["usage"]["completion_tokens"]
    out.update(sent=sent, first=stamps[0] if stamps else None, last=stamps[-1] if stamps else sent, tokens=usage)


def one_round(url: str, model: str, questions: list[list], max_tokens: int, together: bool) -> tuple[float, float]:
    """(aggregate tokens/s from the first request sent to the last token, the last client's wait for its
    first token)."""
    results = [{} for _ in questions]
    started = time.perf_counter()
    if together:
        threads = [threading.Thread(target=stream, args=(url, model, q, max_tokens, r)) for q, r in zip(questions, results)]
        for thread in threads:
            thread.start()
            time.sleep(0.05)  # arrival order as written
        for thread in threads:
            thread.join()
    else:
        for question, result in zip(questions, results):
            stream(url, model, question, max_tokens, result)
    ended = max(result["last"] for result in results)
    tokens = sum(result["tokens"] for result in results)
    last = results[-1]
    return tokens / (ended - started), last["first"] - last["sent"]


LONG = [{"role": "user", "content": "Write a long story, of at least 800 words, about a lighthouse keeper."}]


def late_client(url: str, model: str, late: list, max_tokens: int) -> tuple[float, bool]:
    """The first token's wait of a request sent 2 s into another's long answer, and whether that answer
    had ended by then (as where the request queues behind it)."""
    ahead, behind = {}, {}
    running = threading.Thread(target=stream, args=(url, model, LONG, max_tokens * 4, ahead))
    running.start()
    time.sleep(2)
    stream(url, model, late, max_tokens, behind)
    running.join()
    return behind["first"] - behind["sent"], ahead["last"] < behind["first"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--parallel", default=None, help="the server's -np (default: --clients)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--no-draft", action="store_true")
    args = parser.parse_args()

    command = [sys.executable, "-m", "localspec", "serve", args.model, "--temp", "0", "--port", "0", "--offline",
               "-np", str(args.parallel or args.clients), "-c", "1024"] + (["--no-draft"] if args.no_draft else [])
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        url = server.stdout.readline().split(" on ")[1].split()[0]
        fresh = iter([prompt.messages for prompt in load_prompts("mtbench", None)])
        one_round(url, args.model, [next(fresh)], 8, False)  # warm: the auto policy's costs, the first allocation
        ratios = []
        for round_number in range(args.rounds):
            alone, _ = one_round(url, args.model, [next(fresh) for _ in range(args.clients)], args.max_tokens, False)
            together, wait = one_round(url, args.model, [next(fresh) for _ in range(args.clients)], args.max_tokens,
                                       True)
            ratios.append(together / alone)
            print(f"round {round_number + 1}: one at a time {alone:.1f} tok/s, {args.clients} at once {together:.1f}"
                  f" tok/s ({together / alone:.2f}x); last client's first token after {wait:.2f} s", flush=True)
        if ratios:
            print(f"median ratio {statistics.median(ratios):.2f}x over {args.rounds} rounds")
        # the same question twice, each behind a mark of its own, so that neither finds the other's prompt cached
        question = next(fresh)
        marked = [[*question[:-1], {**question[-1], "content": f"({mark}) " + question[-1]["content"]}]
                  for mark in (1, 2)]
        idle = {}
        stream(url, args.model, marked[0], args.max_tokens, idle)
        wait, behind = late_client(url, args.model, marked[1], args.max_tokens)
        print(f"first token of a request on an idle server after {idle['first'] - idle['sent']:.2f} s; of the same"
              f" sent 2 s into another's long answer, after {wait:.2f} s"
              + (" (once that answer had ended)" if behind else " (while it streamed)"))
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
