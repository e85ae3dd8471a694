"""`localspec chat` in a real pseudo-terminal, and scripted through a pipe."""

import json
import os
import subprocess
import sys

import pexpect
import pytest

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
    assert "cannot load" in done.stdout.decode()


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
