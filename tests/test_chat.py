"""`localspec chat` in a real pseudo-terminal, and scripted through a pipe."""

import inspect
import json
import os
import subprocess
import sys

import pexpect
import pyte
import pytest

from localspec.chat import Chat
from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation
from localspec.engine import backend
from localspec.session import Session

PROMPT = "you> "


@pytest.fixture
def home(tmp_path, real_model):
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(real_model("smollm2-135m").parent.parent)
    return home


def spawn(home, *args):
    env = {**os.environ, "LOCALSPEC_HOME": str(home), "COLUMNS": "100", "LINES": "40", "TERM": "xterm"}
    child = pexpect.spawn(sys.executable, ["-m", "localspec", "chat", *args], env=env, encoding="utf-8",
                          timeout=120, dimensions=(40, 100))
    child.expect("/help for commands")
    child.expect_exact(PROMPT)
    return child


@pytest.mark.slow
def test_two_turns_stats_interrupt_and_exit_in_a_terminal(home, tmp_path):
    child = spawn(home, "smollm2-135m", "--draft", "ngram", "--temp", "0", "-n", "40", "--offline")
    child.sendline("Name three colours.")
    child.expect(r"prompt (\d+) tokens \((\d+) cached\)")
    first_prompt = int(child.match.group(1))
    child.expect_exact(PROMPT)

    child.sendline("And three animals?")
    child.expect(r"prompt (\d+) tokens \((\d+) cached\)")
    second_prompt, cached = int(child.match.group(1)), int(child.match.group(2))
    assert second_prompt > first_prompt and cached >= first_prompt - 1  # turn 1 stays in the KV cache
    child.expect_exact(PROMPT)

    child.sendline("/stats")
    child.expect("speculation · this chat")
    child.expect_exact(PROMPT)

    child.sendline("/draft off")
    child.expect("speculation off")
    child.expect_exact(PROMPT)

    child.sendline("Write a very long story about a dragon.")
    child.expect("speculation · generating")  # the reply has started
    child.sendintr()
    child.expect_exact("(stopped)")
    child.expect_exact(PROMPT)

    saved = tmp_path / "chat.json"
    child.sendline(f"/save {saved}")
    child.expect("saved 6 messages")
    child.expect_exact(PROMPT)
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    roles = [m["role"] for m in json.loads(saved.read_text())]
    assert roles == ["user", "assistant"] * 3


@pytest.mark.slow
def test_set_verbose_follows_each_reply_in_a_terminal_with_ollamas_timings(home):
    child = spawn(home, "smollm2-135m", "--temp", "0", "-n", "8", "--offline")
    child.sendline("/set verbose")
    child.expect("each reply followed by its timings")
    child.expect_exact(PROMPT)
    child.sendline("Name three colours.")
    child.expect(r"eval count: +8 token\(s\)")
    child.expect(r"eval rate: +[0-9.]+ tokens/s")
    child.expect_exact(PROMPT)
    child.sendline("/set quiet")
    child.expect("no reply followed by its timings")
    child.expect_exact(PROMPT)
    child.sendline("And three animals?")
    child.expect(r"prompt \d+ tokens")
    child.expect_exact(PROMPT)
    assert "eval rate" not in child.before
    child.sendline("/bye")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


@pytest.mark.slow
def test_ctrl_d_leaves_and_unknown_commands_are_explained(home):
    child = spawn(home, "smollm2-135m", "--offline")
    child.sendline("/frobnicate")
    child.expect("unknown command /frobnicate")
    child.expect_exact(PROMPT)
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


@pytest.mark.slow
def test_piped_chat_answers_one_message_a_line(home):
    done = subprocess.run(
        [sys.executable, "-m", "localspec", "chat", "smollm2-135m", "--temp", "0", "-n", "20", "--offline",
         "--system", "Answer briefly."],
        input="Hello!\nWhat did I just say?\n", capture_output=True, text=True, timeout=300,
        env={**os.environ, "LOCALSPEC_HOME": str(home)},
    )
    assert done.returncode == 0, done.stderr
    assert len([line for line in done.stdout.splitlines() if line.strip()]) >= 2


def test_markup_and_unwritable_paths_in_commands_keep_the_chat_going(localspec, tiny):
    """`/[/]` once ended the chat with a Rich MarkupError, and `/save` to a missing folder with a traceback."""
    done = localspec("chat", tiny["target"], "--no-draft", "-n", "3",
                     stdin=b"/[/]\n/save /missing/dir/x.json\nthe cat\n")
    out = done.stdout.decode()
    assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr
    assert "unknown command /[/]" in out and "cannot save to /missing/dir/x.json" in out
    assert out.strip().splitlines()[-1]  # the message after them was answered


def test_a_block_of_lines_is_one_message_and_a_saved_chat_loads(localspec, tiny, tmp_path):
    saved, earlier, resaved = tmp_path / "saved.json", tmp_path / "earlier.json", tmp_path / "resaved.json"
    earlier.write_text(json.dumps([{"role": "user", "content": "old question"}, {"role": "assistant", "content": "old"}]))
    script = f'"""\nline one\nline two\n"""\n/save {saved}\n/load {earlier}\n/load {tmp_path}/none.json\n/save {resaved}\n'
    done = localspec("chat", tiny["target"], "--no-draft", "-n", "3", stdin=script.encode())
    assert done.returncode == 0, done.stderr
    messages = json.loads(saved.read_text())
    assert [m["role"] for m in messages] == ["user", "assistant"] and messages[0]["content"] == "line one\nline two"
    assert json.loads(resaved.read_text()) == json.loads(earlier.read_text())
    said = " ".join(done.stdout.decode().split())  # (as wrapped to the width)
    assert "cannot load" in said and "/load FILE.json reads what /save FILE.json wrote" in said


def test_save_and_load_a_model_as_ollamas_chat_does(localspec, tiny):
    """Ollama's /save MODEL and /load MODEL (they wrote and read a file named so): a model made of the chat, its
    system prompt, parameters and messages; the chat switched to it; a model that does not open leaves the chat
    going on with the one it had (a failed open let it go first: its next reply crashed the process)."""
    script = ("/set parameter temperature 0.3\n/set system Be brief.\nhello\n/save mine\n/load mine\n/show system\n"
              "/show parameters\n/load nosuch\n/load smollm2-135m\nthe cat\n/save qwen2.5-coder-1.5b\n")
    done = localspec("chat", tiny["target"], "--no-draft", "-n", "3", "--offline", stdin=script.encode())
    said = " ".join(done.stdout.decode().split())  # (as wrapped to the width)
    assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr
    assert f"created model mine from {tiny['target']} (2 messages, 2 parameters, its system prompt)" in said, said
    assert "chatting with target.gguf, from its beginning (2 messages of its own) Be brief. temperature 0.3" in said
    assert "cannot load nosuch: unknown model 'nosuch'" in said
    assert "cannot load smollm2-135m: smollm2-135m is not downloaded" in said and "the chat goes on with target.gguf" in said
    assert said.split("the chat goes on with target.gguf")[-1].split("cannot save")[0].strip()  # (the cat, answered)
    assert "cannot save qwen2.5-coder-1.5b: qwen2.5-coder-1.5b is a model the registry names" in said
    modelfile = localspec("show", "mine", "--modelfile").stdout.decode()
    for line in ("PARAMETER temperature 0.3", "PARAMETER num_predict 3", "SYSTEM Be brief.", "MESSAGE user hello"):
        assert line in modelfile, modelfile


def test_a_system_prompt_in_triple_quotes_and_several_stop_strings_are_read_as_ollamas_chat_reads_them(localspec,
                                                                                                      tiny):
    # `/set system """...` set the quotes and the first line, and sent the next lines to the model as a message;
    # `/set parameter stop "." "!"` set one stop string, quotes and all
    script = ('/set system """You are a pirate.\nAlways say arr."""\n/show system\n/set parameter stop "." "!"\n'
              '/show parameters\n/set system """Be terse."""\n/show system\n')
    done = localspec("chat", tiny["target"], "--no-draft", "-n", "3", stdin=script.encode())
    out = done.stdout.decode()
    assert done.returncode == 0 and "You are a pirate.\nAlways say arr.\n" in out and '"""' not in out, out
    assert "\nBe terse.\n" in out and "stop               [\".\", \"!\"]" in out, out
    assert "tokens" not in out  # (nothing was sent to the model)


@pytest.mark.slow
def test_ctrl_c_in_a_block_of_lines_drops_it_and_the_chat_goes_on(home):
    # it ended the chat (exit 130), the conversation lost
    child = spawn(home, "smollm2-135m", "--offline")
    # (each line once its prompt is up: a Ctrl-C typed ahead of the line it follows may flush that line unread)
    child.sendline('"""')
    child.expect_exact("... ")
    child.sendline("half a message")
    child.expect_exact("half a message")
    child.expect_exact("... ")
    child.sendintr()
    child.expect("message dropped")
    child.expect_exact(PROMPT)
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


@pytest.mark.slow
def test_a_pasted_block_of_lines_is_one_message_in_a_terminal(home, tmp_path):
    child = spawn(home, "smollm2-135m", "--temp", "0", "-n", "8", "--offline")
    # what a terminal sends when three lines are pasted with bracketed paste on, then Enter
    child.send("\x1b[200~def f(x):\n    return x + 1\nprint(f(2))\x1b[201~")
    child.send("\r")
    child.expect(r"prompt \d+ tokens")
    child.expect_exact(PROMPT)
    saved = tmp_path / "chat.json"
    child.sendline(f"/save {saved}")
    child.expect("saved 2 messages")  # one question, one answer
    child.expect_exact(PROMPT)
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    assert json.loads(saved.read_text())[0]["content"] == "def f(x):\n    return x + 1\nprint(f(2))"


@pytest.mark.slow
def test_a_paste_taller_than_the_terminal_shows_whole_before_the_reply(home):
    # readline's echo of such a paste lost rows and wrote the tails of lines over others
    child = spawn(home, "smollm2-135m", "--temp", "0", "-n", "4", "--offline")
    screen = pyte.Screen(100, 40)
    stream = pyte.Stream(screen)
    lines = [f"line {i}: " + "some pasted text of a long document " * 3 for i in range(60)]
    child.send("\x1b[200~" + "\n".join(lines) + "\x1b[201~")
    child.send("\r")
    child.expect(r"prompt \d+ tokens")
    stream.feed(child.before + child.after)
    child.expect_exact(PROMPT)
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    shown = [row.rstrip() for row in screen.display]
    pasted = [row for row in shown if row.startswith("line ")]
    assert "line 59: " + "some pasted text of a long document " * 2 in "\n".join(shown), shown
    assert all(row.rstrip() == lines[int(row.split(":")[0][5:])][:100].rstrip() for row in pasted), shown


def test_a_draft_length_beyond_the_batch_is_refused_and_the_chat_goes_on(tiny):
    from rich.console import Console

    from localspec.chat import Chat
    from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation
    from localspec.session import Session

    with Session(tiny["target"], None, Runtime(ctx_size=256, threads=2), Speculation(DrafterKind.NGRAM)) as session:
        chat = Chat(session, Sampling(), Limits(max_tokens=4))
        console = Console(record=True, width=200)
        assert chat.command("/draft 100000", console)  # the chat goes on (this error used to end it)
        assert "exceeds this session's batch" in console.export_text() and session.draft_limit == 3
        assert chat.command("/draft 5", console) and session.draft_limit == 5


def test_a_long_chat_drops_its_oldest_turns_keeps_the_system_prompt_and_goes_on(tiny):
    # at a full context every message failed until /clear; Ollama and LM Studio drop the oldest turns
    with Session(tiny["target"], None, Runtime(ctx_size=1024, threads=2), Speculation(DrafterKind.NGRAM)) as session:
        conversation = session.chat("be brief", Sampling(temperature=0), Limits(max_tokens=16))
        dropped, reused = [], []
        for number in range(30):  # (about 100 of the tiny tokenizer's tokens a turn)
            conversation.send(f"message number {number}: " + "the cat sat on the mat " * 3)
            dropped.append(conversation.dropped)
            reused.append(conversation.turn.summary().reused_prompt_tokens)
        messages = conversation.messages
        assert messages[0] == {"role": "system", "content": "be brief"}
        assert messages[-2]["content"].startswith("message number 29") and messages[-1]["role"] == "assistant"
        assert "message number 0:" not in json.dumps(messages)
        # half the context at once, as llama.cpp's context shift: the turns between drops read the earlier
        # ones from the cache
        assert 0 < sum(1 for d in dropped if d) <= len(dropped) / 3, dropped
        assert all(tokens > 0 for tokens, drop in zip(reused[1:], dropped[1:]) if not drop), (reused, dropped)


def test_set_and_bye_as_in_ollama_and_a_full_context_said_in_one_line(localspec, tiny):
    lines = ["/set parameter num_predict 2", "/set parameter temprature 1", "/set system be brief",
             *(f"message {n}: " + "the cat sat on the mat " * 3 for n in range(12)), "/bye", "never read"]
    done = localspec("chat", tiny["target"], "--no-draft", "-c", "256", "--temp", "0", "-n", "16",
                     stdin=("\n".join(lines) + "\n").encode())
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0 and "Traceback" not in err, err
    assert "num_predict set to 2" in out and "did you mean temperature?" in out and "system prompt set" in out
    assert "turns were dropped to fit the context of 256 tokens (the system prompt is kept)" in err
    replies = [line for line in out.splitlines() if line and "set" not in line and "did you mean" not in line]
    assert len(replies) == 12  # one a message; nothing after /bye


def test_a_parameter_set_to_a_value_of_the_wrong_kind_is_refused_and_the_chat_goes_on(localspec, tiny):
    # `/set parameter temperature abc` ended the chat with a traceback; num_ctx was refused with every setting's name
    lines = ["/set parameter temperature abc", "/set parameter seed 1.5", "/set parameter ignore_eos yes",
             "/set parameter ignore_eos false", "/set parameter num_ctx 4096", "/set parameter num_predict abc", "hello"]
    done = localspec("chat", tiny["target"], "--no-draft", "--temp", "0", "-n", "4",
                     stdin=("\n".join(lines) + "\n").encode())
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0 and "Traceback" not in out + err, out + err
    assert "temperature must be a number, got 'abc'" in out and "seed must be a whole number, got 1.5" in out
    assert "ignore_eos must be true or false, got 'yes'" in out and "ignore_eos set to false" in out
    assert "num_ctx is fixed when the model loads: start the chat with -c 4096" in out
    assert "num_predict must be a whole number, got 'abc'" in out  # (under the name typed)
    assert out.rstrip().splitlines()[-1].strip()  # the message after them was answered


def test_show_and_question_mark_as_in_ollama(localspec, tiny):
    lines = ["/?", "/show info", "/set parameter temperature 0.3", "/set parameter stop END", "/show parameters",
             "/show system", "/set system be brief", "/show system", "/show license"]
    done = localspec("chat", tiny["target"], "--temp", "0", "-n", "6", stdin=("\n".join(lines) + "\n").encode())
    out = done.stdout.decode()
    assert done.returncode == 0 and "/show info|parameters|system" in out, done.stderr
    assert f"{tiny['target'].name} (" in out and "context " in out and " tokens, vocabulary " in out
    assert "temperature        0.3" in out and 'stop               ["END"]' in out and "num_predict        6" in out
    assert "(no system prompt)" in out and "\nbe brief\n" in out and "usage: /show info" in out


def spawn_chat(home, *args, n: int):
    """A chat in a pseudo-terminal with a reply limit of n tokens, as a user starts it."""
    env = {**os.environ, "LOCALSPEC_HOME": str(home), "COLUMNS": "100", "LINES": "40", "TERM": "xterm"}
    env.pop("LOCALSPEC_DEBUG", None)
    child = pexpect.spawn(sys.executable, ["-m", "localspec", "chat", *map(str, args), "--temp", "0", "-n", str(n)],
                          env=env, encoding="utf-8", timeout=300, dimensions=(40, 100))
    child.expect("/help for commands")
    child.expect_exact(PROMPT)
    return child


def interrupt_a_reply_then_chat_on(child, interrupts: int = 3, reuses_cache: bool = True) -> None:
    """Ctrl-C a reply as soon as it streams, a few times over, then ask again: every later reply comes
    back whole, with no error, the conversation (and both KV caches) going on from the stopped reply.
    reuses_cache: the earlier turns are read from the cache (a recurrent state goes back to the start
    of the conversation's end only from snapshots of its last decode, so a hybrid target reads it all)."""
    for _ in range(interrupts):
        child.sendline("Write a very long story about a dragon and a lighthouse keeper.")
        index = child.expect(["speculation · generating", "error: "])  # the reply has started, or failed
        assert index == 0, child.before + child.after + child.read_nonblocking(2000, timeout=2)
        child.sendintr()
        child.expect_exact("(stopped)")
        child.expect_exact(PROMPT)
    child.sendline("And now a short one, please.")
    index = child.expect([r"prompt (\d+) tokens \((\d+) cached\)", "error: "])
    assert index == 0, child.before + child.after + child.read_nonblocking(2000, timeout=2)
    assert int(child.match.group(2)) > 0 or not reuses_cache
    child.expect_exact(PROMPT)
    child.sendline("/save " + os.devnull)
    child.expect(f"saved {2 * (interrupts + 1)} messages")  # each stopped reply kept as far as it got
    child.expect_exact(PROMPT)
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


@pytest.mark.slow
@pytest.mark.parametrize("drafting", [["--no-draft"], ["--draft", "ngram", "--spec", "fixed"]], ids=["plain", "ngram"])
def test_ctrl_c_keeps_the_chat_going_on_a_real_model(home, drafting):
    interrupt_a_reply_then_chat_on(spawn_chat(home, "smollm2-135m", *drafting, "--offline", n=400))


@pytest.mark.slow
def test_ctrl_c_keeps_the_chat_going_with_a_draft_model(tmp_path, real_model):
    target, draft = real_model("qwen2.5-coder-1.5b"), real_model("qwen2.5-coder-0.5b")
    child = spawn_chat(tmp_path / "home", target, "--draft", draft, "--spec", "fixed", n=200)
    interrupt_a_reply_then_chat_on(child, interrupts=2)


@pytest.mark.parametrize("drafting", [["--draft", "mtp"], ["--draft", "ngram", "--spec", "fixed"], ["partial"]],
                         ids=["mtp", "hybrid-ngram", "hybrid-draft-model"])
def test_ctrl_c_keeps_the_chat_going_with_tiny_models(tmp_path, tiny, drafting):
    """The MTP block (of a hybrid trunk, as Qwen3.5's) and a hybrid target (a recurrent state beside
    attention) with either drafter."""
    if drafting == ["partial"]:
        target, drafting = tiny["hybrid"], ["--draft", tiny["hybrid_partial"], "--spec", "fixed"]
    else:
        target = tiny["mtp"] if drafting[1] == "mtp" else tiny["hybrid"]
    child = spawn_chat(tmp_path / "home", target, *drafting, n=600)
    interrupt_a_reply_then_chat_on(child, reuses_cache=False)  # both targets keep a recurrent state


ENGINE = os.path.dirname(backend.__file__)


class InterruptAt:
    """Raise KeyboardInterrupt at the n-th line the engine runs, as Ctrl-C does at the first bytecode
    after a C call returns (n=None: only count them). A trace function that raises is unset."""

    def __init__(self, n: int | None):
        self.n, self.count = n, 0

    def __enter__(self):
        sys.settrace(self.call)
        return self

    def __exit__(self, *exc):
        sys.settrace(None)

    def call(self, frame, event, arg):
        return self.line if frame.f_code.co_filename.startswith(ENGINE) else None

    def line(self, frame, event, arg):
        if event == "line":
            self.count += 1
            if self.count == self.n:
                raise KeyboardInterrupt
        return self.line


@pytest.mark.parametrize("target,drafting,draft", [
    ("target", DrafterKind.PLAIN, None), ("target", DrafterKind.NGRAM, None), ("target", DrafterKind.DRAFT, "partial"),
    ("target", DrafterKind.AUTO, "partial"), ("mtp", DrafterKind.MTP, None),
    ("hybrid", DrafterKind.DRAFT, "hybrid_partial"), ("hybrid", DrafterKind.NGRAM, None),
    # drafters published beside their target (DRAFT: as the file says, eagle3, dflash or Gemma 4's assistant)
    ("markov_target", DrafterKind.DRAFT, "eagle3"), ("markov_target", DrafterKind.AUTO, "dflash"),
    ("gemma4", DrafterKind.DRAFT, "gemma4_assistant"),
])
def test_a_ctrl_c_at_any_line_of_the_engine_leaves_caches_the_next_reply_can_use(monkeypatch, tiny, target,
                                                                                 drafting, draft):
    """Every step of the reply after an interrupted one checks that each KV cache holds exactly what
    the generation expects (CHECK_CACHES, on in tests), so a cache left with positions its Context
    does not know of, or without ones it thinks it has, fails here."""
    if drafting == DrafterKind.AUTO:
        hold_autos_clock(monkeypatch)
    speculation = Speculation(drafting, draft_max=4)
    with Session(tiny[target], tiny[draft] if draft else None, Runtime(ctx_size=4096, threads=2), speculation) as session:
        chat = Chat(session, Sampling(temperature=0), Limits(max_tokens=10))

        def trial(n: int | None) -> InterruptAt:
            """A reply interrupted at its n-th line (None: counted), after one that has filled the caches, then one
            after it; the conversation short, and auto's learning and suffix memory as at the first trial (the
            lines of each trial's reply as the count's)."""
            chat.clear()
            session.forget()
            chat.reply("the cat sat", lambda event: None)
            with InterruptAt(n) as interrupted:
                chat.reply("on the mat", lambda event: None)
            chat.reply("the cat", lambda event: None)  # every step of it found the caches right
            assert len(chat.messages) == 6
            return interrupted

        trial(None)  # (the caches left as every trial leaves them for the next)
        counted = trial(None)
        points = range(1, counted.count, max(1, counted.count // TRIALS))
        stopped = sum(trial(n).count == n for n in points)  # (a reply that ran fewer lines than n was not stopped)
        assert stopped > 0.9 * len(points)


class InterruptAfterDecode(InterruptAt):
    """Raise KeyboardInterrupt at the first line after llama_decode returned (Context._run's finally), in the first
    decode that `wanted` picks (given _run's frame)."""

    def __init__(self, wanted):
        super().__init__(None)
        lines, first = inspect.getsourcelines(backend.Context._run)
        self.at = first + next(i for i, line in enumerate(lines) if line.strip() == "finally:") + 1
        self.wanted, self.fired = wanted, False

    def line(self, frame, event, arg):
        if event == "line" and not self.fired and frame.f_code.co_name == "_run" and frame.f_lineno == self.at \
                and self.wanted(frame):
            self.fired = True
            raise KeyboardInterrupt
        return self.line


def _a_trees(frame) -> bool:
    caller = frame.f_back
    return caller.f_code.co_name == "decode_together" and any(part.tree is not None for part in caller.f_locals["parts"])


def _rows(frame) -> bool:
    return frame.f_locals.get("tokens") is False


@pytest.mark.parametrize("target,draft,speculation,wanted", [
    ("target", "partial", Speculation(DrafterKind.DRAFT, draft_max=4, branches=3), _a_trees),
    ("markov_target", "dflash", Speculation(DrafterKind.DRAFT, draft_max=4), _rows),
], ids=["a-tree", "rows-for-tokens"])
def test_a_ctrl_c_as_llama_cpp_returns_leaves_the_batch_the_next_decode_needs(tiny, target, draft, speculation,
                                                                               wanted):
    """A tree's decode puts a row in several sequences, and one of rows (a DFlash drafter's catch-up, an image) lends
    the batch rows in place of its tokens; both were put back after the decode, and a Ctrl-C at the line after it
    left them: the next reply's prompt went into the tree's sequences too (llama_decode refused it, -1), or every
    later decode met a batch without tokens (NULL pointer access, then a double free at exit)."""
    with Session(tiny[target], tiny[draft], Runtime(ctx_size=4096, threads=2), speculation) as session:
        chat = Chat(session, Sampling(temperature=0), Limits(max_tokens=10))
        interrupted = InterruptAfterDecode(wanted)
        for _ in range(20):
            chat.clear()
            chat.reply("the cat sat", lambda event: None)
            with interrupted:
                chat.reply("on the mat", lambda event: None)
            if interrupted.fired:
                break
        assert interrupted.fired
        for _ in range(3):
            chat.reply("the cat", lambda event: None)  # every step of it found the caches right


TRIALS = 100


def hold_autos_clock(monkeypatch):
    """Auto's choices follow the seconds it measures (the costs it learns, what a probe may spend), so a machine
    loaded by other work changed them, and the lines of one reply from the next (a trial's line n fell past the end
    of its reply): costs fixed where drafting pays and not learned, and the engine's clock one that ticks a
    millisecond a reading, make every trial's reply the count's."""
    from itertools import count

    from localspec import drafting
    from localspec.engine import costs, speculative, turns
    from localspec.engine.drafters import forward
    from localspec.engine.drafters.spec import KINDS

    fixed = costs.Costs(0.01, {1: 1.0, 2: 1.1, 4: 1.2, 8: 1.4, 16: 1.8},
                        {kind: costs.DraftCosts(0.1, 0.02) for kind in KINDS})
    monkeypatch.setattr(drafting.calibration, "costs", lambda key, measure: fixed)
    monkeypatch.setattr(costs.Costs, "observe_verify", lambda *args: None)  # (session.forget() keeps what it learned)
    monkeypatch.setattr(costs.Costs, "observe_draft", lambda *args: None)
    ticks = count()
    for module in (speculative, turns, backend, forward):
        monkeypatch.setattr(module, "perf_counter", lambda: next(ticks) / 1000)


class Terminal:
    """Standard output that says it is a terminal, and keeps what was written."""

    def __init__(self, tty: bool):
        self.tty, self.written = tty, ""

    def isatty(self):
        return self.tty

    def write(self, text):
        self.written += text

    def flush(self):
        pass


@pytest.mark.parametrize("tty", [True, False])
def test_a_piped_chat_escapes_model_text_on_a_terminal_and_keeps_it_exact_elsewhere(monkeypatch, tty):
    import io

    from localspec import chat

    reply = "\x1b]52;c;cm0gLXJmIH4=\x07copied \x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\ \x9b31m\x7f"

    class Scripted:
        dropped, verbose = 0, False

        def reply(self, text, show):
            return reply

    stdout = Terminal(tty)
    monkeypatch.setattr(sys, "stdin", io.StringIO("hi\n"))
    monkeypatch.setattr(sys, "stdout", stdout)
    chat.run(Scripted(), interactive=False, color=False, history_file=None)
    if tty:
        assert not any(c in stdout.written for c in "\x1b\x07\x9b\x7f")
        assert stdout.written == "\\x1b]52;c;cm0gLXJmIH4=\\x07copied \\x1b]8;;http://x\\x1b\\link\\x1b]8;;\\x1b\\ \\x9b31m\\x7f\n"
    else:
        assert stdout.written == reply + "\n"
