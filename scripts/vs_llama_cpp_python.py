"""Plain decoding, localspec beside llama-cpp-python's own `Llama`, same model and sampling, one run.

    python scripts/vs_llama_cpp_python.py [--model smollm2-135m] [--temp 0.8] [--max-tokens 256] [--runs 5]

On a model whose tokens take a few milliseconds, host work shows: this compares
decode speed (tokens per second after the first token) with llama.cpp's default
sampler settings (top-k 40, top-p 0.95, min-p 0.05) at the given temperature.
Runs alternate between the two, each from an empty KV cache; prints every run's
figures and the median ratio.
"""

import argparse
import statistics
from time import perf_counter

import llama_cpp
from llama_cpp import Llama

from localspec.store import download, registry
from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation, default_threads
from localspec.request import Request
from localspec.stats import record
from localspec.session import Session

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."


def llama_cpp_python_rate(llm: Llama, prompt: list[int], sampling: Sampling, max_tokens: int) -> tuple[int, float]:
    llm.reset()
    started, produced = None, 0
    for token in llm.generate(prompt, top_k=sampling.top_k, top_p=sampling.top_p, min_p=sampling.min_p,
                              temp=sampling.temperature, reset=True):
        if llama_cpp.llama_vocab_is_eog(llm._model.vocab, token):
            break
        produced += 1
        if started is None:
            started = perf_counter()  # the first token came with the prompt's evaluation
        if produced == max_tokens:
            break
    return produced, (produced - 1) / (perf_counter() - started)


def localspec_rate(session: Session, prompt: list[int], sampling: Sampling, max_tokens: int) -> tuple[int, float]:
    session.reset()
    summary = record(session.generate(Request(sampling, Limits(max_tokens=max_tokens), prompt=prompt))).summary()
    return summary.tokens, summary.tokens_per_second


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--temp", type=float, default=0.8)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=default_threads())
    args = parser.parse_args()

    path = download.locate(registry.resolve(args.model))
    llm = Llama(model_path=str(path), n_ctx=2048, n_batch=512, n_threads=args.threads, n_threads_batch=args.threads,
                verbose=False)
    ratios = []
    with Session(path, None, Runtime(ctx_size=2048, threads=args.threads), Speculation(DrafterKind.PLAIN)) as session:
        prompt = session.prompts.tokenize(PROMPT, raw=False)
        for run in range(1, args.runs + 1):
            seeded = Sampling(temperature=args.temp, seed=run)
            ours_tokens, ours = localspec_rate(session, prompt, seeded, args.max_tokens)
            llm.set_seed(run)
            theirs_tokens, theirs = llama_cpp_python_rate(llm, prompt, seeded, args.max_tokens)
            ratios.append(ours / theirs)
            print(f"run {run}: localspec {ours:.1f} tok/s ({ours_tokens} tokens), llama-cpp-python {theirs:.1f}"
                  f" tok/s ({theirs_tokens} tokens), ratio {ours / theirs:.2f}")
    print(f"{args.model}, temperature {args.temp}, {args.threads} threads: localspec / llama-cpp-python,"
          f" median of {args.runs} runs: {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
