"""Parallel sequences of one context: decoded together, each generation as it is alone; the service
behind serve -np, batch --parallel, and how many sequences fit."""

import json
import threading
import time
import urllib.request

import numpy as np
import openai
import pytest

from localspec.store import gguf_meta, hardware
from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation
from localspec.engine.backend import Context, Part, decode_together
from localspec.engine.hidden import LAST_HIDDEN
from localspec.engine.model import Model
from localspec.engine import together as together_module
from localspec.engine import turns as turns_module
from localspec.engine.drafters import ModelDrafter, NgramDrafter, NoDrafter
from localspec.engine.speculative import generate
from localspec.engine.together import ENDED, Together
from localspec.errors import EngineError
from localspec.events import Done, Prefill, Step, Token
from localspec.store.placement import Placement
from localspec.request import Request
from localspec.service import FINISHED, Busy, Service
from localspec.store.placement import parallel_that_fits
from localspec.store import Pair
from localspec.session import Session
from localspec.stats import record
from sequences import run_alone, run_together
from test_server import ServerProcess

GREEDY = Sampling(temperature=0.0)
PROMPTS = ["the cat sat on the mat", "a b c a b c a b", "hello hello hello world", "once upon a time"]


def four_sequences(path):
    """The four sequences of a context of a model, closed at the end."""
    model = Model(path)
    context = Context(model, 256, 64, threads=2, backend_sampling=False, max_outputs=64, n_seq=4)
    yield [context] + [context.sequence(seq) for seq in range(1, 4)]
    context.close()
    model.close()


@pytest.fixture(scope="module")
def shared(tiny):
    yield from four_sequences(tiny["target"])


@pytest.fixture(scope="module")
def alone(load):
    return load("target")


def tokens_of(model, text):
    return model.tokenize(text, add_special=True, parse_special=False)


@pytest.mark.parametrize("drafter", [NoDrafter, lambda: NgramDrafter(1, 3)], ids=["plain", "ngram"])
def test_each_sequence_generates_what_it_does_alone(shared, alone, drafter):
    prompts = [tokens_of(alone.model, text) for text in PROMPTS]
    expected = [run_alone(alone, prompt, drafter()) for prompt in prompts]
    got, steps = run_together(shared, prompts, [drafter() for _ in prompts])
    assert [got[i] for i in range(len(prompts))] == expected
    # the steps shared their decode: each counts the rows the others added
    assert any(step.batch_rows > 0 for key in steps for step in steps[key])


def test_sequences_keep_their_own_caches_and_reuse_a_prefix(shared, alone):
    prompts = [tokens_of(alone.model, text) for text in PROMPTS]
    run_together(shared, prompts, [NoDrafter() for _ in prompts])
    for sequence, prompt in zip(shared, prompts):
        assert sequence.tokens[: len(prompt) - 1] == prompt[:-1]
        sequence.check_holds(sequence.tokens)
    # a sequence that ends early leaves the others going, and joins again with its prefix kept
    again = prompts[1] + tokens_of(alone.model, " more")[1:]
    assert shared[1].keep_common(again) == len(prompts[1])


def test_a_failed_joint_decode_leaves_every_sequence_as_it_was(shared, alone):
    for sequence in shared[:2]:
        sequence.truncate(0)
        sequence.decode(tokens_of(alone.model, "the cat"), logits="none")
    before = [list(sequence.tokens) for sequence in shared[:2]]
    with pytest.raises(EngineError):
        decode_together([Part(shared[0], [1, 2]), Part(shared[1], [5] * 65, "none")])  # more rows than a batch
    assert [sequence.tokens for sequence in shared[:2]] == before
    for sequence in shared[:2]:
        sequence.check_holds(sequence.tokens)


def test_a_dropped_generation_hands_out_nothing_more(shared, alone):
    prompts = [tokens_of(alone.model, text) for text in PROMPTS[:2]]
    together = Together()
    for i, prompt in enumerate(prompts):
        together.add(i, generate(shared[i], NoDrafter(), prompt, GREEDY, Speculation(), Limits(max_tokens=30)))
    seen = {0: 0, 1: 0}
    for _ in range(200):
        if not together:
            break
        for key, item in together.step():
            assert key in together or item is ENDED or isinstance(item, Exception)
            if isinstance(item, Token):
                seen[key] += 1
                if key == 0 and seen[0] == 3:
                    together.drop(0)
    assert seen[0] == 3 and seen[1] == 30


@pytest.mark.parametrize("name", ["mtp", "markov_target"], ids=["last-hidden", "layer-inputs"])
def test_each_sequence_keeps_the_hidden_states_of_its_own_rows(tiny, name):
    model = Model(tiny[name], load_mtp=name == "mtp")
    kept = (LAST_HIDDEN,) if name == "mtp" else gguf_meta.read(tiny["dflash"]).target_layers
    contexts = []
    try:
        joint = Context(model, 256, 128, 2, max_outputs=8, keep_hidden=kept, n_seq=3)
        contexts.append(joint)
        views = [joint, joint.sequence(1), joint.sequence(2)]
        prompts = [tokens_of(model, text) for text in PROMPTS[:3]]
        decode_together([Part(view, prompt, "last") for view, prompt in zip(views, prompts)])
        for view, prompt in zip(views, prompts):
            solo = Context(model, 256, 128, 2, max_outputs=8, keep_hidden=kept)
            contexts.append(solo)
            solo.decode(prompt, logits="last")
            for position in range(len(prompt)):
                assert np.allclose(view.hidden.row(position), solo.hidden.row(position), atol=1e-3), position
    finally:
        for context in contexts:
            context.close()
        model.close()


def test_a_generation_dropped_while_its_turn_waits_is_not_decoded(shared, alone):
    together = Together()
    for i, text in enumerate(PROMPTS[:2]):
        together.add(i, generate(shared[i], NoDrafter(), tokens_of(alone.model, text), GREEDY, Speculation(),
                                 Limits(max_tokens=30)))
    for _ in range(3):
        list(together.step())
    held = None
    for key, item in together.step():
        if key == 1 and 0 in together:  # the first has handed its turn in already
            held = list(shared[0].tokens)
            together.drop(0)
    assert held is not None and shared[0].tokens == held


class Inbox:
    def __init__(self, log: list, name: str):
        self.log, self.name, self.items, self.done = log, name, [], threading.Event()

    def __call__(self, item) -> None:
        self.log.append((self.name, type(item).__name__))
        self.items.append(item)
        if item is FINISHED:
            self.done.set()

    @property
    def tokens(self) -> list[int]:
        return [item.id for item in self.items if isinstance(item, Token)]


def served(session: Session, requests: list[Request]) -> list:
    """The jobs of these requests, submitted at once to a service of the session and finished."""
    service, log = Service(session, queue_limit=4, log=print), []
    try:
        inboxes = [Inbox(log, i) for i in range(len(requests))]
        jobs = [service.submit(request, inbox) for request, inbox in zip(requests, inboxes)]
        for inbox in inboxes:
            assert inbox.done.wait(60)
    finally:
        service.close()
    return jobs


def plain_texts(tiny, prompts: list[str], max_tokens: int, target: str = "target") -> list[str]:
    with Session(tiny[target], None, Runtime(ctx_size=512), Speculation(drafting=DrafterKind.PLAIN)) as single:
        return [single.complete(p, raw=True, sampling=GREEDY, limits=Limits(max_tokens)).text for p in prompts]


@pytest.fixture(scope="module", params=[DrafterKind.PLAIN, DrafterKind.AUTO], ids=["plain", "auto"])
def parallel_session(tiny, request):
    with Session(tiny["target"], None, Runtime(ctx_size=512, parallel=3), Speculation(drafting=request.param)) as opened:
        yield opened


def test_requests_on_parallel_sequences_generate_together_each_as_alone(parallel_session, tiny):
    prompts = ["the cat sat", "a b c a b c a b", "once upon a time", "hello hello world", "zzz yyy"]
    with Session(tiny["target"], None, Runtime(ctx_size=512), Speculation(drafting=DrafterKind.PLAIN)) as alone:
        expected = [[event.id for event in alone.generate(Request(GREEDY, Limits(24), prompt=alone.prompts.tokenize(p, raw=True)))
                     if isinstance(event, Token)] for p in prompts]
    service, log = Service(parallel_session, queue_limit=4, log=print), []
    try:
        inboxes = [Inbox(log, i) for i in range(len(prompts))]
        jobs = [service.submit(Request(GREEDY, Limits(24), prompt=p), inbox) for p, inbox in zip(prompts, inboxes)]
        for inbox in inboxes:
            assert inbox.done.wait(60)
        assert [inbox.tokens for inbox in inboxes] == expected
        assert [job.outcome for job in jobs] == ["ok"] * len(prompts)
        # three ran at once: the second and third started before the first ended, the fourth after one ended
        started = [log.index((i, "Prefill")) for i in range(len(prompts))]
        first_done = min(log.index((i, "Done")) for i in range(3))
        assert max(started[:3]) < first_done < started[3]
        assert {job.sequence for job in jobs[:3]} == {0, 1, 2}
        assert any(item.batch_rows for inbox in inboxes for item in inbox.items if isinstance(item, Step))
        text = service.metrics.prometheus(running=0, waiting=0)
        for sequence in range(3):
            assert f'localspec:sequence_generation_tokens_total{{sequence="{sequence}"}}' in text
        assert service.running == 0
    finally:
        service.close()


def test_the_queue_holds_queue_limit_beyond_the_sequences(parallel_session):
    service, log = Service(parallel_session, queue_limit=1, log=print), []
    try:
        inboxes = [Inbox(log, i) for i in range(4)]
        jobs = [service.submit(Request(GREEDY, Limits(300), prompt="abc"), inbox) for inbox in inboxes]
        with pytest.raises(Busy):
            service.submit(Request(GREEDY, Limits(4), prompt="abc"), Inbox(log, "refused"))
        for job in jobs:
            job.cancel()
        for inbox in inboxes:
            assert inbox.done.wait(60)
        assert service.running == 0 and service.pending == 0
    finally:
        service.close()


def test_one_requests_bad_input_answers_it_alone(parallel_session):
    service, log = Service(parallel_session, queue_limit=4, log=print), []
    try:
        good, bad = Inbox(log, "good"), Inbox(log, "bad")
        service.submit(Request(GREEDY, Limits(16), prompt="abc"), good)
        service.submit(Request(GREEDY, Limits(16), prompt="x" * 5000), bad)  # more than the context holds
        assert good.done.wait(60) and bad.done.wait(60)
        assert any(isinstance(item, Done) for item in good.items)
        assert any(isinstance(item, Exception) for item in bad.items)
        assert service.running == 0
    finally:
        service.close()


def test_a_conversation_resent_goes_to_the_sequence_that_holds_it(parallel_session):
    service, log = Service(parallel_session, queue_limit=4, log=print), []
    try:
        first = [Inbox(log, i) for i in range(3)]
        jobs = [service.submit(Request(GREEDY, Limits(8), prompt=f"conversation {i} says hello"), inbox)
                for i, inbox in enumerate(first)]
        for inbox in first:
            assert inbox.done.wait(60)
        again = Inbox(log, "again")
        job = service.submit(Request(GREEDY, Limits(8), prompt="conversation 1 says hello and more"), again)
        assert again.done.wait(60)
        assert job.sequence == jobs[1].sequence
        prefill = next(item for item in again.items if isinstance(item, Prefill))
        assert prefill.reused_tokens >= 4
    finally:
        service.close()


def test_batch_parallel_writes_each_item_as_parallel_1_does(localspec, tiny, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": text}) + "\n"
                               for i, text in enumerate(PROMPTS * 2)) + '{"id": "bad", "prompt": "a", "top_k": 1.5}\n')
    outputs = {}
    for parallel in ("1", "3"):
        done = localspec("batch", tiny["target"], prompts, "--temp", "0", "-n", "12", "-np", parallel, "--draft", "ngram")
        assert done.returncode == 1, done.stderr  # the bad item
        outputs[parallel] = {r["id"]: r.get("text", r.get("error")) for r in map(json.loads, done.stdout.splitlines())}
        assert (b"3 sequences generate at once" in done.stderr) == (parallel == "3")
    assert outputs["1"] == outputs["3"] and len(outputs["3"]) == 2 * len(PROMPTS) + 1


@pytest.mark.parametrize("value, said", [("x", "takes a number of sequences or auto"), ("65", "takes 1 to 64")])
def test_parallel_refuses_what_is_not_a_count(cli, tiny, value, said):
    code, _, err = cli("batch", tiny["target"], "-", "-np", value, stdin=b"hi\n")
    assert code == 2 and said in err


def test_batch_parallel_drafts_with_the_targets_mtp_layers_for_every_item(localspec, tiny, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": text}) + "\n" for i, text in enumerate(PROMPTS)))
    outputs = {}
    for parallel in ("1", "3"):
        done = localspec("batch", tiny["mtp"], prompts, "--temp", "0", "-n", "16", "-np", parallel, "--draft", "mtp",
                         "--p-min", "0")
        assert done.returncode == 0, done.stderr
        records = [json.loads(line) for line in done.stdout.splitlines()]
        assert all(r["stats"]["drafters"]["mtp"]["accepted"] > 0 for r in records)
        outputs[parallel] = {r["id"]: r["text"] for r in records}
    assert outputs["1"] == outputs["3"] and len(outputs["3"]) == len(PROMPTS)


def test_the_front_door_of_a_parallel_session_generates_alone(parallel_session, tiny):
    with Session(tiny["target"], None, Runtime(ctx_size=512), Speculation(drafting=DrafterKind.PLAIN)) as single:
        expected = single.complete("the cat sat", raw=True, sampling=GREEDY, limits=Limits(20)).text
    reply = parallel_session.complete("the cat sat", raw=True, sampling=GREEDY, limits=Limits(20))
    assert reply.text == expected and reply.summary.tokens == 20


def test_a_long_prompt_is_read_in_pieces_beside_the_others_tokens(shared, alone):
    short = tokens_of(alone.model, "the cat")
    long = tokens_of(alone.model, " ".join(["word"] * 36))
    assert len(long) > 4 * shared[1].prompt_piece
    together, seen = Together(), []
    together.add(0, generate(shared[0], NoDrafter(), short, GREEDY, Speculation(), Limits(max_tokens=30)))
    for _ in range(2):  # the first is under way before the long prompt arrives
        seen += [(key, type(item).__name__) for key, item in together.step()]
    together.add(1, generate(shared[1], NoDrafter(), long, GREEDY, Speculation(), Limits(max_tokens=5)))
    while together:
        seen += [(key, type(item).__name__) for key, item in together.step()]
    read = seen.index((1, "Prefill"))
    # while the long prompt was read, piece by piece, the first sequence went on generating
    assert seen[:read].count((0, "Token")) >= 4 + seen[:2].count((0, "Token"))
    expected = run_alone(alone, long, NoDrafter())[:5]
    assert shared[1].tokens[len(long) : len(long) + 4] == expected[:4]


def machine_with(free: int) -> hardware.Machine:
    return hardware.Machine(gpu_offload=False, rpc=False, devices=[], ram_total=free, ram_available=free, cpu="test",
                            features="")


def test_the_memory_check_counts_every_sequences_cache_and_auto_takes_as_many_as_fit(tiny):
    info = gguf_meta.read(tiny["target"])
    room = machine_with(10**12)
    one = Placement.plan(Runtime(ctx_size=4096), info, machine=room).check_fit()
    four = Placement.plan(Runtime(ctx_size=4096, parallel=4), info, machine=room).check_fit()
    assert four - one == 3 * hardware.kv_cache_bytes(info, 4096)
    with pytest.raises(Exception, match=r"4 sequences of 4096 tokens; a smaller --parallel needs less"):
        Placement.plan(Runtime(ctx_size=4096, parallel=4), info, machine=machine_with(four - 1)).check_fit()
    two = Placement.plan(Runtime(ctx_size=4096, parallel=2), info, machine=room).check_fit()
    auto = Runtime(ctx_size=4096, parallel=0)
    for free, expected in ((four, 4), (four - 1, 2), (two, 2), (two - 1, 1)):
        assert parallel_that_fits(auto, info, None, machine_with(free)) == expected


@pytest.fixture(scope="module")
def shared_draft(tiny):
    yield from four_sequences(tiny["partial"])


@pytest.fixture
def decodes(monkeypatch):
    """The turns of each batch Together decodes, as they are decoded."""
    seen = []

    def decode(turns):
        seen.append([(turn.drafts, len(turn.tokens)) for turn in turns])
        turns_module.decode(turns)

    monkeypatch.setattr(together_module, "decode", decode)
    return seen


def test_a_draft_model_drafts_for_every_sequence_side_by_side(shared, shared_draft, alone, load, decodes):
    prompts = [tokens_of(alone.model, text) for text in PROMPTS]
    draft_alone, vocab = load("partial"), alone.model.n_vocab
    expected = [run_alone(alone, prompt, ModelDrafter(draft_alone, 0.0, vocab)) for prompt in prompts]
    got, steps = run_together(shared, prompts, [ModelDrafter(view, 0.0, vocab) for view in shared_draft])
    assert [got[i] for i in range(len(prompts))] == expected
    for key in steps:  # each sequence drafted with the draft model, and some of the drafts were rejected
        assert {step.drafter for step in steps[key] if step.drafted} == {DrafterKind.DRAFT}
        assert sum(step.accepted for step in steps[key]) > 0
    assert any(step.accepted < step.drafted for key in steps for step in steps[key])
    drafting = [batch for batch in decodes if batch[0][0]]
    verifying = [batch for batch in decodes if not batch[0][0]]
    assert max(len(batch) for batch in drafting) == 4  # the four sequences' draft tokens in one decode
    # every generation waited for its drafts, so that each step verified all of them in one batch: one
    # decode for the prompts, then one a step
    assert len(verifying) == 1 + max(len(steps[key]) for key in steps)
    assert max(len(batch) for batch in verifying) == 4
    for sequence in shared_draft:
        sequence.check_holds(sequence.tokens)


def test_the_draft_model_reads_a_long_prompt_in_pieces_beside_the_others_drafts(shared, shared_draft, alone, load,
                                                                                decodes):
    prompts = [tokens_of(alone.model, text) for text in (" ".join(["word"] * 36), "the cat sat")]
    assert len(prompts[0]) > 2 * shared_draft[0].prompt_piece
    draft_alone, vocab = load("partial"), alone.model.n_vocab
    expected = [run_alone(alone, prompt, ModelDrafter(draft_alone, 0.0, vocab)) for prompt in prompts]
    got, _ = run_together(shared[:2], prompts, [ModelDrafter(view, 0.0, vocab) for view in shared_draft[:2]])
    assert [got[0], got[1]] == expected
    pieces = [rows for batch in decodes for drafts, rows in batch if drafts and rows > 1]
    assert len(pieces) >= 2 and max(pieces) <= shared_draft[0].prompt_piece


def test_a_draft_model_drafts_for_every_sequence_of_a_session(tiny):
    prompts = ["the cat sat", "a b c a b c a b", "once upon a time"]
    with Session(tiny["target"], tiny["partial"], Runtime(ctx_size=512, parallel=3),
                 Speculation(drafting=DrafterKind.DRAFT, required=True, p_min=0.0)) as session:
        assert not any("draft model drafts for the first only" in note for note in session.notes)
        jobs = served(session, [Request(GREEDY, Limits(16), prompt=p) for p in prompts])
    assert [job.recorder.text for job in jobs] == plain_texts(tiny, prompts, 16)
    assert sorted(job.sequence for job in jobs) == [0, 1, 2]
    for job in jobs:
        assert job.recorder.drafters.keys() == {DrafterKind.DRAFT} and job.recorder.accepted > 0


@pytest.mark.parametrize("target, draft, kind", [("mtp", None, DrafterKind.MTP),
                                                 ("mtp_trunk", "mtp_sidecar", DrafterKind.MTP),
                                                 ("markov_target", "eagle3", DrafterKind("eagle3")),
                                                 ("markov_target", "dflash", DrafterKind("dflash")),
                                                 ("gemma4", "gemma4_assistant", DrafterKind.MTP)],
                         ids=["mtp", "mtp-sidecar", "eagle3", "dflash", "gemma4-assistant"])
def test_a_drafter_of_the_targets_hidden_states_drafts_for_every_sequence_side_by_side(tiny, decodes, target, draft,
                                                                                       kind):
    prompts = ["the cat sat", "a b c a b c a b", "once upon a time"]
    speculation = Speculation(drafting=kind, required=True, p_min=0.0)
    with Session(tiny[target], tiny[draft] if draft else None, Runtime(ctx_size=512), speculation) as single:
        alone = [record(single.generate(Request(GREEDY, Limits(16), prompt=single.prompts.tokenize(p, raw=True)))) for p in prompts]
    with Session(tiny[target], tiny[draft] if draft else None, Runtime(ctx_size=512, parallel=3),
                 speculation) as session:
        jobs = served(session, [Request(GREEDY, Limits(16), prompt=p) for p in prompts])
    assert [job.recorder.text for job in jobs] == plain_texts(tiny, prompts, 16, target)
    # each read the target's hidden states of its own rows of the shared batches: its drafts fared as alone
    assert [(job.recorder.drafted, job.recorder.accepted) for job in jobs] == [(a.drafted, a.accepted) for a in alone]
    for job in jobs:
        assert job.recorder.drafters.keys() == {kind} and job.recorder.accepted > 0
    if draft != "gemma4_assistant":  # (which reads the target's cache at its next position, one sequence a decode)
        assert max(len(batch) for batch in decodes if batch[0][0]) > 1  # drafted for several at once


def test_auto_takes_parallel_sequences_beside_any_drafter(tiny):
    auto, room = Runtime(ctx_size=512, parallel=0), machine_with(10**12)
    pairs = [("mtp", None), ("hybrid", "hybrid_partial"), ("markov_target", "eagle3"), ("gemma4", "gemma4_assistant")]
    for target, draft in pairs:
        pair = Pair(gguf_meta.read(tiny[target]), gguf_meta.read(tiny[draft]) if draft else None)
        assert parallel_that_fits(auto, pair.target, pair.draft, room) == 4, target


def test_a_draft_model_with_a_recurrent_state_drafts_for_every_sequence_too(tiny):
    prompts = ["the cat sat", "a b c a b c a b", "once upon a time"]
    with Session(tiny["target"], tiny["hybrid_partial"], Runtime(ctx_size=512, parallel=3),
                 Speculation(drafting=DrafterKind.DRAFT, required=True, p_min=0.0)) as session:
        jobs = served(session, [Request(GREEDY, Limits(16), prompt=p) for p in prompts])
    assert [job.recorder.text for job in jobs] == plain_texts(tiny, prompts, 16)
    for job in jobs:  # each drafted from a state of its own, taken back to a checkpoint after each draft
        assert job.recorder.drafters.keys() == {DrafterKind.DRAFT} and job.recorder.drafted > 0


@pytest.mark.parametrize("name", ["hybrid", "mtp"], ids=["lfm2", "qwen35"])
def test_a_target_with_a_recurrent_state_generates_on_each_sequence_as_alone(tiny, name):
    """Rejected drafts are taken back out of each sequence's recurrent state by its own snapshots, beside
    the other sequences' rows (of other lengths) in the same decodes."""
    model = Model(tiny[name])
    try:
        context = Context(model, 256, 64, threads=2, backend_sampling=False, max_outputs=8, n_seq=4)
        sequences = [context] + [context.sequence(seq) for seq in range(1, 4)]
        assert context.recurrent and context.rollback > 0
        alone_context = Context(model, 256, 64, threads=2, backend_sampling=False, max_outputs=8)
        prompts = [tokens_of(model, text) for text in PROMPTS]
        expected = [run_alone(alone_context, prompt, NgramDrafter(1, 3)) for prompt in prompts]
        got, steps = run_together(sequences, prompts, [NgramDrafter(1, 3) for _ in prompts])
        assert [got[i] for i in range(len(prompts))] == expected
        assert any(step.accepted < step.drafted for key in steps for step in steps[key])  # some were taken back
        assert any(step.batch_rows for key in steps for step in steps[key])
        alone_context.close()
        context.close()
    finally:
        model.close()


def test_a_grammar_and_sampling_beside_each_other_generate_as_alone(parallel_session, tiny):
    grammar = 'root ::= "ab" [a-c]+ "."'
    requests = [Request(Sampling(temperature=0.8, seed=3), Limits(20), prompt="the cat sat"),
                Request(Sampling(temperature=0, grammar=grammar), Limits(20), prompt="a b c a b"),
                Request(Sampling(temperature=1.0, seed=5, top_k=8), Limits(20), prompt="once upon")]
    with Session(tiny["target"], None, Runtime(ctx_size=512), Speculation(drafting=parallel_session.mode)) as single:
        expected = [record(single.generate(Request(r.sampling, r.limits, prompt=single.prompts.tokenize(r.prompt, raw=True)))).text
                    for r in requests]
    jobs = served(parallel_session, requests)
    if parallel_session.mode == DrafterKind.PLAIN:
        assert [job.recorder.text for job in jobs] == expected
    else:  # what auto drafts (its suffix cache holds the module's earlier answers) moves which draws a seed makes
        assert jobs[1].recorder.text == expected[1]
        assert all(job.outcome == "ok" and 0 < job.recorder.tokens <= 20 for job in jobs)
    assert expected[1].startswith("ab") and expected[1].endswith(".")
    assert {job.sequence for job in jobs} == {0, 1, 2}


def test_one_request_turns_speculation_off_and_the_others_go_on_drafting(tiny, tmp_path):
    """Four clients at once on four sequences, the draft model drafting for each; one asks for plain decoding."""
    running = ServerProcess(tmp_path, tiny["target"], "--draft", tiny["same"], "--spec", "fixed", "--p-min", "0",
                            "--temp", "0", "-c", "512", "-np", "4", "--alias", "tiny")
    try:
        client = running.client()
        asks = [{"speculative": {"mode": "off"}}, {}, {"speculative": {"mode": "fixed", "draft": "ngram"}},
                {"speculative": {"draft_max": 1}}]
        answers: list = [None] * len(asks)

        def ask(number: int) -> None:
            answers[number] = client.completions.create(model="tiny", prompt=f"the cat sat {number}", max_tokens=24,
                                                        extra_body=asks[number])

        threads = [threading.Thread(target=ask, args=(number,)) for number in range(len(asks))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        records = [answer.model_extra["speculation"] for answer in answers]
        assert [r["drafting"] for r in records] == ["plain", "draft", "ngram", "draft"]
        assert records[0]["draft_tokens"] == 0 and records[1]["draft_tokens"] > 0 and records[2]["drafters"]
        assert len(records[3]["drafts_by_position"]) == 1  # one token a step at most
        assert any(r["steps_shared"] for r in records)  # (some ran at once: which shared a step is the clock's choice)
        assert answers[0].choices[0].text == plain_texts(tiny, ["the cat sat 0"], 24)[0]
        with pytest.raises(openai.BadRequestError, match="the mtp mode needs"):
            client.completions.create(model="tiny", prompt="x", max_tokens=2,
                                      extra_body={"speculative": {"mode": "fixed", "draft": "mtp"}})
        for wrong in ({"mode": "sometimes"}, {"draft_max": -1}, {"draft_max": "3"}, {"mode": "off", "draft": "ngram"}):
            with pytest.raises(openai.BadRequestError):
                client.completions.create(model="tiny", prompt="x", max_tokens=2, extra_body={"speculative": wrong})
        # Ollama's draft_num_predict (the ollama package keeps no field it does not know: read as sent)
        body = json.dumps({"model": "tiny", "prompt": "the cat sat", "raw": True, "stream": False,
                           "options": {"num_predict": 16, "draft_num_predict": 1}}).encode()
        sent = urllib.request.Request(running.base + "/api/generate", data=body, headers={"Content-Type": "application/json"})
        shortest = json.loads(urllib.request.urlopen(sent, timeout=60).read())
        assert shortest["response"] and len(shortest["speculation"]["drafts_by_position"]) == 1
    finally:
        assert running.stop() == 0, running.log()


def test_a_prompt_a_busy_sequence_holds_is_read_once(parallel_session):
    """A request for the prompt another sequence is generating from (OpenAI's n, several clients' same
    question) takes that sequence's cells instead of reading it again, and makes what it would alone;
    another client's request shares nothing."""
    service, log = Service(parallel_session, queue_limit=4, log=print), []
    prompt = "a b c a b c the cat sat on the mat and then"
    try:
        first = Inbox(log, "first")
        leader = service.submit(Request(GREEDY, Limits(40), prompt=prompt, client="me"), first)
        deadline = time.monotonic() + 60
        while not any(isinstance(item, Prefill) for item in first.items) and time.monotonic() < deadline:
            time.sleep(0.001)
        second, stranger = Inbox(log, "second"), Inbox(log, "stranger")
        jobs = [service.submit(Request(GREEDY, Limits(40), prompt=prompt, client=who), inbox)
                for who, inbox in (("me", second), ("stranger", stranger))]
        for inbox in (first, second, stranger):
            assert inbox.done.wait(60)
        prefills = {inbox.name: next(item for item in inbox.items if isinstance(item, Prefill))
                    for inbox in (first, second, stranger)}
        assert prefills["first"].reused_tokens == 0 and prefills["stranger"].reused_tokens == 0
        assert prefills["second"].reused_tokens == prefills["second"].prompt_tokens - 1
        assert first.tokens == second.tokens == stranger.tokens and len(first.tokens) == 40
        assert log.index(("second", "Prefill")) < log.index(("first", "Done"))  # it ran beside the first
        assert jobs[0].sequence != leader.sequence
    finally:
        service.close()


def test_prompt_logprobs_on_parallel_sequences_are_as_alone(parallel_session, tiny):
    """An echoed prompt's logprobs read in turns beside the other sequences' rows (pieces of a quarter
    batch) are the ones read alone, and so is the text after them."""
    prompts = ["the cat sat on the mat " * 8, "once upon a time", "a b c a b c a b"]
    scoring = Sampling(temperature=0.0, prompt_logprobs=1)
    with Session(tiny["target"], None, Runtime(ctx_size=512), Speculation(drafting=DrafterKind.PLAIN)) as alone:
        expected = [record(alone.generate(Request(scoring, Limits(8), prompt=p))) for p in prompts]
    jobs = served(parallel_session, [Request(scoring, Limits(8), prompt=p) for p in prompts])
    for job, single in zip(jobs, expected):
        got, want = job.recorder.prompt_logprobs, single.prompt_logprobs
        assert job.recorder.text == single.text and len(got) == len(want) > 1
        assert [e.chosen.id for e in got] == [e.chosen.id for e in want] and got[0].chosen.logprob is None
        # (a row computed in another batch differs a little: up to 1e-3 of it on this CPU)
        assert [e.chosen.logprob for e in got[1:]] == pytest.approx([e.chosen.logprob for e in want[1:]], rel=2e-3, abs=5e-3)
