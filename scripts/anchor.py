"""localspec beside llama.cpp's own llama-speculative-simple, on the same prompts, in one run.

    python scripts/anchor.py [--target qwen2.5-coder-1.5b] [--draft qwen2.5-coder-0.5b]
                             [--prompts all] [--limit 5] [--max-tokens 128] [--mixed] [--no-draft-simple]

llama-speculative-simple is built from the llama.cpp sources vendored in the
llama-cpp-python sdist we pin (the same llama.cpp commit as our binding), once,
into the localspec cache; nothing built is committed. Each prompt is rendered
with the target's chat template and given to both, greedy, same thread count:
llama.cpp with a draft model (draft-simple, same draft length and p-min as our
fixed policy), with n-gram lookup (ngram-simple, its own defaults) and plain
(ngram-simple looking up a 1024-token key, which never matches: the tool has no
mode without a drafter, and this leaves its own decode loop drafting nothing);
localspec plain, fixed draft model, fixed n-gram and auto. Runs are interleaved
prompt by prompt. Prints one table of tokens/s and ratios: llama.cpp plain /
localspec plain tells the two engines' speed apart from what drafting adds.
"""

import argparse
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from localspec import bench, paths

from localspec.store import download, registry
from localspec.chat_template import render
from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation, default_threads
from localspec.request import Request
from localspec.stats import record
from localspec.session import Session

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"  # see README: ggml's AMX kernels crash on this CPU
DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")


def build_anchor() -> Path:
    root = paths.models_dir().parent / "anchor"
    binary = root / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp" / "build" / "bin" / "llama-speculative-simple"
    if binary.exists():
        return binary
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q",
                        "-d", scratch, LLAMA_CPP_PYTHON], check=True)
        with tarfile.open(next(Path(scratch).glob("*.tar.gz"))) as sdist:
            sdist.extractall(root, filter="data")
    source = binary.parents[2]
    flags = NO_AMX if os.uname().machine == "x86_64" else ""
    print(f"building llama-speculative-simple in {source} (a few minutes)...", file=sys.stderr)
    subprocess.run(["cmake", "-S", source, "-B", source / "build", "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF",
                    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF", f"-DCMAKE_C_FLAGS={flags}",
                    f"-DCMAKE_CXX_FLAGS={flags}"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", source / "build", "--target", "llama-speculative-simple", "-j",
                    str(os.cpu_count() or 2)], check=True, stdout=subprocess.DEVNULL)
    return binary


NEVER_MATCHES = ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "1024"]


def run_anchor(binary: Path, target: Path, speculation: list, prompt: str, args) -> tuple[int, float]:
    """Tokens decoded and seconds taken by llama-speculative-simple with these speculation flags."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(prompt)
    command = [binary, "-m", target, "-f", f.name, "-n", str(args.max_tokens), "--temp", "0", "-t", str(args.threads),
               "-c", "4096", "-b", "4096", *speculation]  # a whole retrieval prompt in one batch
    try:
        # Seen once in a 20-minute run: an exit status 1 that the same prompt did not repeat. One more
        # try keeps such a blip from throwing the whole run away; a second failure is reported.
        for attempt in range(2):
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode == 0:
                break
            print(f"llama-speculative-simple exited with {done.returncode}: {done.stderr[-2000:]}", file=sys.stderr)
        else:
            raise SystemExit("llama-speculative-simple failed twice on the same prompt; see its output above")
    finally:
        os.unlink(f.name)
    tokens, seconds = DECODED.search(done.stdout + done.stderr).groups()
    return int(tokens), float(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b")
    parser.add_argument("--prompts", default="all", help="prompt sets as for localspec bench (default: all)")
    parser.add_argument("--mixed", action="store_true", help="auto keeps what it learned from set to set")
    parser.add_argument("--no-draft-simple", dest="draft_simple", action="store_false",
                        help="skip llama.cpp and localspec with a draft model (they do not pay on a small CPU)")
    parser.add_argument("--limit", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--draft-max", type=int, default=3)
    parser.add_argument("--p-min", type=float, default=0.6)
    parser.add_argument("--threads", type=int, default=default_threads())
    args = parser.parse_args()

    binary = build_anchor()
    target = download.locate(registry.resolve(args.target))
    draft = download.locate(registry.resolve(args.draft))
    # label -> (mode, most tokens drafted a step: llama.cpp's for fixed drafting, auto's own default)
    modes = {"plain": (DrafterKind.PLAIN, args.draft_max), "fixed": (DrafterKind.DRAFT, args.draft_max),
             "ngram": (DrafterKind.NGRAM, args.draft_max), "auto": (DrafterKind.AUTO, None)}
    if not args.draft_simple:
        del modes["fixed"]
    draft_simple = ["-md", draft, "--spec-type", "draft-simple", "--spec-draft-n-max", str(args.draft_max),
                    "--spec-draft-n-min", "0", "--spec-draft-p-min", str(args.p_min)]
    sets = bench.expand(args.prompts)
    totals: dict[tuple[str, str], list[float]] = {}

    def add(name: str, label: str, tokens: int, seconds: float) -> None:
        entry = totals.setdefault((name, label), [0, 0.0])
        entry[0] += tokens
        entry[1] += seconds

    speculation = Speculation(DrafterKind.DRAFT, p_min=args.p_min)
    with Session(target, draft, Runtime(threads=args.threads), speculation) as session:
        template = session.target_model.chat_template()
        bos, eos = session.target_model.special_text("bos"), session.target_model.special_text("eos")
        for name in sets:
            prompts = bench.load_prompts(name, args.limit)
            if not args.mixed:
                session.forget()
            for number, prompt in enumerate(prompts, start=1):
                conversation = bench.own_replies(session, prompt.messages, Limits(max_tokens=args.max_tokens))
                text = render(template, conversation, bos, eos)
                print(f"{name} {number}/{len(prompts)}", file=sys.stderr)
                if args.draft_simple:
                    add(name, "draft-simple", *run_anchor(binary, target, draft_simple, text, args))
                add(name, "ngram-simple", *run_anchor(binary, target, ["--spec-type", "ngram-simple"], text, args))
                add(name, "llama.cpp plain", *run_anchor(binary, target, NEVER_MATCHES, text, args))
                prompt_tokens = session.prompts.chat_tokens(conversation)
                for label, (mode, draft_max) in modes.items():
                    session.set_draft_max(draft_max)
                    session.use(mode)
                    session.reset()
                    events = session.generate(Request(Sampling(temperature=0), Limits(max_tokens=args.max_tokens), prompt=prompt_tokens))
                    outcome = record(events)
                    add(name, label, outcome.tokens, outcome.decode_seconds)

    columns = {"draft-simple": "llama.cpp draft-simple", "ngram-simple": "llama.cpp ngram-simple",
               "llama.cpp plain": "llama.cpp plain", "plain": "localspec plain", "fixed": "localspec fixed draft",
               "ngram": "localspec fixed ngram", "auto": "localspec auto"}
    shown = [label for label in columns if any(lab == label for _, lab in totals)]
    ratios = [("llama.cpp plain", "plain"), ("auto", "plain"), ("ngram-simple", "plain"),
              ("auto", "best of plain and ngram-simple")]
    if args.draft_simple:
        ratios = [("fixed", "draft-simple"), ("auto", "draft-simple")] + ratios
    print("| prompt set | " + " | ".join(columns[label] for label in shown) + " | "
          + " | ".join(f"{a} / {b}" for a, b in ratios) + " |")
    print("|---|" + "---:|" * (len(shown) + len(ratios)))
    for name in sets:
        speed = {label: t / s for (n, label), (t, s) in totals.items() if n == name}
        speed["best of plain and ngram-simple"] = max(speed["plain"], speed["ngram-simple"])
        print(f"| {name} | " + " | ".join(f"{speed[label]:.2f}" for label in shown) + " | "
              + " | ".join(f"{speed[a] / speed[b]:.2f}x" for a, b in ratios) + " |")


if __name__ == "__main__":
    main()
