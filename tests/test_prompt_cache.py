"""Prompts kept on disk (engine/prompt_cache.py) on tiny real GGUFs: a prompt read back from its file continues as
its reading did, in another context as in another process; only what pays is kept or read; the cap holds."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from localspec.config import Limits, Rope, Sampling, Speculation
from localspec.engine.backend import Context
from localspec.engine.drafters import ModelDrafter, NoDrafter
from localspec.engine.model import Model
from localspec.engine import prompt_cache
from localspec.engine.prompt_cache import PromptCache
from localspec.paths import prompts_of
from localspec.engine.speculative import generate
from localspec.loading import _cache_variant
from localspec.events import Prefill, Token

GREEDY = Sampling(temperature=0.0)
PLAIN = Speculation(draft_max=4, p_min=0.0)


@pytest.fixture
def opened(tiny):
    """opened(name, root, least_seconds=0) -> a fresh context on a tiny model, keeping prompts under root."""
    made = []

    def open_context(name: str, root, least_seconds: float = 0.0, most_bytes: int = 1 << 30,
                     n_seq: int = 1) -> Context:
        model = Model(tiny[name])
        context = Context(model, 256, 64, threads=2, max_outputs=64, n_seq=n_seq)
        context.prompt_cache = PromptCache(root, model.path, most_bytes, least_seconds)
        made.append((context, model))
        return context

    yield open_context
    for context, model in made:
        context.close()
        model.close()


def prompt_of(n: int, seed: int = 0) -> list[int]:
    return [1] + [int(t) for t in np.random.default_rng(seed).integers(3, 60, n - 1)]


def generation(context, prompt, drafter=None, max_tokens=24):
    """(tokens, prompt tokens reused) of a greedy generation, its prompt's file (where one is kept) written."""
    events = list(generate(context, drafter or NoDrafter(), prompt, GREEDY, PLAIN, Limits(max_tokens=max_tokens)))
    prefill = next(e for e in events if isinstance(e, Prefill))
    prompt_cache.settled()
    return [e.id for e in events if isinstance(e, Token)], prefill.reused_tokens


def files(root) -> list:
    return sorted(root.glob("*/p-*.bin"))


def test_a_prompt_read_back_from_disk_continues_as_its_reading_did(opened, tmp_path):
    prompt = prompt_of(120)
    first = opened("target", tmp_path)
    read, reused = generation(first, prompt)
    assert reused == 0 and len(files(tmp_path)) == 1
    again = opened("target", tmp_path)  # a context of its own, as in the next run
    recalled, reused = generation(again, prompt)
    assert reused == len(prompt) - 1 and recalled == read
    # its rows are those the same reading gives, not near them
    fresh = opened("target", tmp_path / "elsewhere")
    fresh.decode(prompt[:-1], "none")
    fresh.decode(prompt[-1:], "last")
    again.keep_common(prompt[:-1])
    again.decode(prompt[-1:], "last")
    assert np.array_equal(again.logits(-1), fresh.logits(-1))


def test_a_prompt_that_begins_alike_reads_back_the_common_part_only(opened, tmp_path):
    prompt = prompt_of(120)
    generation(opened("target", tmp_path), prompt)
    other = prompt[:80] + prompt_of(40, seed=1)[1:]
    context = opened("target", tmp_path)
    tokens, reused = generation(context, other)
    assert reused == 80 + (other[80] == prompt[80])
    assert tokens == generation(opened("target", tmp_path / "elsewhere"), other)[0]
    assert len(files(tmp_path)) == 2  # (neither holds the other's tokens)


def test_a_longer_prompt_replaces_the_file_of_its_beginning(opened, tmp_path):
    prompt = prompt_of(120)
    generation(opened("target", tmp_path), prompt[:60])
    generation(opened("target", tmp_path), prompt)
    [kept] = files(tmp_path)
    assert opened("target", tmp_path).prompt_cache.entries()[0].tokens.tolist() == prompt[:-1]
    assert kept.exists()


def test_what_is_quick_to_read_is_neither_kept_nor_looked_for(opened, tmp_path):
    generation(opened("target", tmp_path, least_seconds=60), prompt_of(120))
    assert files(tmp_path) == []
    generation(opened("target", tmp_path), prompt_of(12))  # fewer tokens than pays to look for
    assert files(tmp_path) == []


def test_a_file_that_is_not_this_models_is_read_as_none_and_not_tried_again(opened, tmp_path):
    prompt = prompt_of(120)
    expected, _ = generation(opened("target", tmp_path / "clean"), prompt)
    generation(opened("target", tmp_path), prompt)
    [kept] = files(tmp_path)
    kept.write_bytes(kept.read_bytes()[: kept.stat().st_size // 2])  # a disk that lost its end
    context = opened("target", tmp_path)
    tokens, reused = generation(context, prompt)
    assert (tokens, reused) == (expected, 0)
    assert context.prompt_cache._failed  # (and not tried again by this process)


def test_each_model_file_has_a_folder_of_its_own(tiny, tmp_path):
    assert prompts_of(tiny["target"], tmp_path) != prompts_of(tiny["partial"], tmp_path)
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(tiny["target"].read_bytes())
    assert prompts_of(copy, tmp_path) != prompts_of(tiny["target"], tmp_path)


def test_the_least_recently_used_go_first_over_the_cap(opened, tmp_path):
    context = opened("target", tmp_path)
    generation(context, prompt_of(100, seed=1))
    size = files(tmp_path)[0].stat().st_size
    context.prompt_cache.most_bytes = int(size * 2.5)
    generation(context, prompt_of(100, seed=2))
    old = files(tmp_path)
    os.utime(old[0], (1, 1))
    os.utime(old[1], (2, 2))
    generation(context, prompt_of(100, seed=3))
    left = files(tmp_path)
    assert len(left) == 2 and old[0] not in left


def test_the_file_is_written_on_a_thread_of_its_own_and_few_states_wait_for_it(opened, tmp_path):
    """The generation goes on while its prompt's file is written (it waited for the disk: seconds for a long
    prompt's state on a GPU); a state waiting to be written is held in memory, so at most MOST_WAITING wait."""
    disk = threading.Event()
    prompt_cache._writer.submit(disk.wait, 60)  # a disk that does not answer yet
    try:
        for seed in range(prompt_cache.MOST_WAITING + 1):
            context = opened("target", tmp_path)
            events = list(generate(context, NoDrafter(), prompt_of(100, seed), GREEDY, PLAIN, Limits(max_tokens=8)))
            assert sum(isinstance(e, Token) for e in events) == 8  # (done, its file not written)
        assert files(tmp_path) == []
    finally:
        disk.set()
    prompt_cache.settled()
    assert len(files(tmp_path)) == prompt_cache.MOST_WAITING


# a process whose prompt cache still has a state to write when it ends
WRITING_AT_EXIT = """
import sys, time
from pathlib import Path
from localspec.engine import prompt_cache
def write():
    time.sleep(float(sys.argv[2]))
    Path(sys.argv[1]).write_text("written")
prompt_cache._waiting.append(prompt_cache._writer.submit(write))
print("ending", flush=True)
"""


def test_the_process_waits_for_its_writes_at_exit_and_a_ctrl_c_then_ends_it_quietly(tmp_path):
    """The writes queued when a run ends are finished before the process exits (the next run reads the file); a
    Ctrl-C during that wait gives up on them: it ended in a traceback of the thread pool's exit hook."""
    done = subprocess.run([sys.executable, "-c", WRITING_AT_EXIT, str(tmp_path / "a"), "1"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and (tmp_path / "a").read_text() == "written", done.stderr
    ending = subprocess.Popen([sys.executable, "-c", WRITING_AT_EXIT, str(tmp_path / "b"), "30"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert ending.stdout.readline() == "ending\n"
    time.sleep(0.5)  # (in the wait at exit)
    ending.send_signal(signal.SIGINT)
    _, err = ending.communicate(timeout=20)
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert not (tmp_path / "b").exists()


def test_prompts_of_another_kv_cache_type_or_rope_scaling_are_kept_apart():
    # (another RoPE scaling leaves a state of the same shape and other values: read back, wrong without a word)
    assert _cache_variant(("f16", "f16"), Rope()) == ""
    assert _cache_variant(("q8_0", "q8_0"), Rope()) == "kv-q8_0-q8_0"
    yarn = _cache_variant(("f16", "f16"), Rope("yarn", freq_scale=0.25))
    assert yarn.startswith("rope-") and yarn != _cache_variant(("f16", "f16"), Rope("yarn", freq_scale=0.5))


def test_a_draft_model_reads_its_prompt_back_too(opened, tmp_path):
    prompt = prompt_of(120)
    target, draft = opened("target", tmp_path), opened("partial", tmp_path)
    tokens, _ = generation(target, prompt, ModelDrafter(draft, 0.0, draft.model.n_vocab))
    assert len(files(tmp_path)) == 2  # one each model's folder
    target, draft = opened("target", tmp_path), opened("partial", tmp_path)
    again, reused = generation(target, prompt, ModelDrafter(draft, 0.0, draft.model.n_vocab))
    assert again == tokens and reused == len(prompt) - 1
    assert draft.tokens[: len(prompt)] == prompt


def test_a_recurrent_state_reads_back_only_a_file_wholly_its_prompts(opened, tmp_path):
    prompt = prompt_of(120)
    expected, _ = generation(opened("hybrid", tmp_path / "clean"), prompt)
    generation(opened("hybrid", tmp_path), prompt[:80])
    tokens, reused = generation(opened("hybrid", tmp_path), prompt)
    assert (tokens, reused) == (expected, 79)
    other = prompt[:60] + prompt_of(60, seed=4)[1:]
    generation(opened("hybrid", tmp_path), prompt)
    tokens, reused = generation(opened("hybrid", tmp_path), other)
    assert reused == 0  # (a state at the end of another prompt cannot be taken back to where they part)


def test_a_sequence_of_a_shared_context_reads_back_into_its_own_cells(opened, tmp_path):
    prompt = prompt_of(100)
    expected, _ = generation(opened("target", tmp_path), prompt)
    shared = opened("target", tmp_path, n_seq=2)
    second = shared.sequence(1)
    shared.decode(prompt_of(50, seed=5), "none")  # the first sequence holds a prompt of its own meanwhile
    second.keep_common(prompt[:-1])
    assert second.tokens == prompt[:-1]
    second.decode(prompt[-1:], "last")
    first_token = int(np.argmax(second.logits(-1)))
    assert first_token == expected[0]
    shared.check_holds(prompt_of(50, seed=5))


def test_each_client_keeps_its_prompts_apart(opened, tmp_path):
    prompt = prompt_of(100)
    context = opened("target", tmp_path)
    base = context.prompt_cache
    context.prompt_cache = base.of("key 1")
    generation(context, prompt)
    for client in ("key 2", None):
        other = opened("target", tmp_path)
        other.prompt_cache = base.of(client)
        assert generation(other, prompt)[1] == 0
    again = opened("target", tmp_path)
    again.prompt_cache = base.of("key 1")
    assert generation(again, prompt)[1] == len(prompt) - 1
    assert base.of("key 1") is context.prompt_cache and base.of("key 1").of(None) is base


@pytest.mark.slow
def test_a_real_models_long_prompt_is_read_back_in_the_next_run(localspec, real_model, tmp_path):
    """Through the command a user runs: the second `run` of a long prompt reads it back from the first's file (each
    a process of its own), the same text following; --prompt-cache off keeps and reads none."""
    source = (Path(__file__).parent.parent / "localspec" / "engine" / "backend.py").read_text()[:6000]
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Summarize this code.\n\n" + source)
    model = real_model("smollm2-135m")

    def run(*more) -> dict:
        done = localspec("run", model, "--no-draft", "-f", prompt, "--temp", "0", "-n", "8", "--json", *more)
        assert done.returncode == 0, done.stderr.decode()
        return json.loads(done.stdout)

    first = run()
    assert first["stats"]["reused_prompt_tokens"] == 0
    if first["stats"]["prefill_seconds"] < 1:
        pytest.skip(f"this machine read the prompt in {first['stats']['prefill_seconds']:.2f} s: too fast to be kept")
    kept = sorted((tmp_path / "home" / "prompts").glob("*/p-*.bin"))
    assert len(kept) == 1
    again = run()
    assert again["stats"]["reused_prompt_tokens"] == again["stats"]["prompt_tokens"] - 1
    assert again["text"] == first["text"]
    off = run("--prompt-cache", "off")
    assert off["stats"]["reused_prompt_tokens"] == 0 and off["text"] == first["text"]


def test_the_listing_is_read_by_several_threads_while_the_writer_adds_and_deletes_files(tmp_path):
    """Readers (serve's sequences) list the folder while the writer's thread writes files, deletes those a longer
    one makes needless and evicts over the cap; no lock is shared with it (one once hung a test run): each
    listing is whole, each entry's tokens those its file holds."""
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    cache = PromptCache(tmp_path / "prompts", model, most_bytes=40_000)
    state = bytes(prompt_cache.STATE_HEAD.size) + bytes(2_000)
    stop, failures, listings = threading.Event(), [], [0]

    def list_until_stopped():
        try:
            while not stop.is_set():
                for entry in cache.entries():
                    assert entry.path.name.startswith(f"p-{prompt_cache._hash(entry.tokens.tolist())}-")
                listings[0] += 1
        except BaseException as error:  # (reported by the test's thread)
            failures.append(error)

    readers = [threading.Thread(target=list_until_stopped) for _ in range(2)]
    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # (threads taking turns at nearly every bytecode, where a shared listing breaks)
    for reader in readers:
        reader.start()
    try:
        for seed in range(60):
            prompt = prompt_of(40 + seed % 20, seed // 20)  # three conversations growing, each file a prefix of the next
            cache._store(prompt, state, 100, prefixes_needless=True)
    finally:
        stop.set()
        for reader in readers:
            reader.join(timeout=60)
        sys.setswitchinterval(switching)
    assert not failures and listings[0] > 0
    assert 0 < len(cache.entries()) <= 40_000 // len(state)
