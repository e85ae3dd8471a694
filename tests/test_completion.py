"""Model names complete on TAB: the script `localspec --install-completion` installs, run by a real bash, and the
protocol zsh's script speaks."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from processes import runner

COMMAND_FOLDER = Path(sys.executable).parent  # (where the installed `localspec` command is, which the script runs)


@pytest.fixture
def home(tmp_path, tiny):
    """A LOCALSPEC_HOME holding a model made with create (terse, from the tiny target), and a user's HOME."""
    (tmp_path / "Modelfile").write_text(f"FROM {tiny['target']}\nSYSTEM You are terse.\n")
    made = runner(tmp_path / "home")("create", "terse", "-f", tmp_path / "Modelfile")
    assert made.returncode == 0, made.stderr
    (tmp_path / "user").mkdir()
    return tmp_path


def environment(tmp_path: Path) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if name != "LOCALSPEC_DEBUG"}
    return env | dict(LOCALSPEC_HOME=str(tmp_path / "home"), HOME=str(tmp_path / "user"),
                      PATH=f"{COMMAND_FOLDER}{os.pathsep}{env['PATH']}")


def test_the_installed_bash_completion_completes_model_names_draft_words_and_option_values(home):
    assert (COMMAND_FOLDER / "localspec").exists(), "the test needs the installed localspec command"
    env = environment(home)
    installed = subprocess.run(["localspec", "--install-completion", "bash"], env=env, capture_output=True,
                               text=True, timeout=120)
    assert installed.returncode == 0, installed.stderr
    assert ".bash_completions/localspec.sh" in (home / "user" / ".bashrc").read_text()

    def tab(*words: str) -> list[str]:
        """What an interactive bash (reading the .bashrc install wrote) offers for the last word."""
        line = " ".join(f"'{word}'" for word in ("localspec", *words))
        shell = subprocess.run(["bash", "-i", "-c", f"COMP_WORDS=({line}); COMP_CWORD={len(words)};"
                                " _localspec_completion localspec; printf '%s\\n' \"${COMPREPLY[@]}\""],
                               env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert "Traceback" not in shell.stderr, shell.stderr
        return [line for line in shell.stdout.splitlines() if line]

    assert tab("run", "te") == ["terse"]  # a model made with create
    assert tab("run", "qwen2.5-coder-1") == ["qwen2.5-coder-1.5b", "qwen2.5-coder-14b"]  # the registry's
    assert tab("chat", "x", "--draft", "ng") == ["ngram"]
    assert {"mtp", "eagle3", "dflash", "assistant", "auto", "qwen2.5-coder-0.5b"} <= set(tab("run", "x", "--draft", ""))
    assert tab("pull", "gemma4-e4b", "--draft", "as") == ["assistant"]  # (Gemma 4's, as --draft takes it)
    assert tab("show", "qwen2.5-coder-0.") == ["qwen2.5-coder-0.5b"]
    assert tab("rm", "ters") == tab("cp", "ters") == tab("check", "ters") == ["terse"]
    assert tab("tokenize", "terse", "ters") == []  # (its text is no model's name)
    assert tab("run", "./mod") == []  # (none: bash completes a file's path instead)
    assert tab("help", "r") == ["run", "rm"]  # (the commands --help lists)
    # the options that take one of a few words
    assert tab("run", "x", "--spec", "") == ["auto", "fixed", "off"]
    assert tab("run", "x", "-ctk", "q8") == ["q8_0"] and tab("serve", "x", "-ctvd", "bf") == ["bf16"]
    assert tab("run", "x", "-sm", "r") == ["row"] and tab("run", "x", "-fa", "") == ["on", "off", "auto"]
    assert tab("chat", "x", "--reasoning-effort", "h") == ["high"] and tab("run", "x", "--rope-scaling", "y") == ["yarn"]
    assert tab("serve", "x", "--reasoning-format", "") == ["auto", "deepseek", "none"]


def test_zsh_gets_each_name_with_what_it_is_and_files_where_no_name_fits(home):
    def tab(line: str) -> str:  # (through `python -m localspec`, which answers as the command does)
        asked = subprocess.run([sys.executable, "-m", "localspec"], env=environment(home) | dict(
            _LOCALSPEC_COMPLETE="complete_zsh", _TYPER_COMPLETE_ARGS=line), capture_output=True, text=True,
            timeout=120)
        assert asked.returncode == 0 and not asked.stderr, asked.stderr
        return asked.stdout

    offered = tab("localspec run qwen2.5-coder-1.")
    assert '"qwen2.5-coder-1.5b":"qwen2.5-coder 1.5B"' in offered and "14b" not in offered and "terse" not in offered
    assert '"terse":"made from ' in tab("localspec serve t")
    assert tab("localspec run ./models/").strip() == "_files"


def test_a_broken_registry_file_of_ones_own_completes_nothing_and_says_nothing(home):
    (home / "home" / "models.toml").write_text("[models.mine\nfile = ")
    asked = subprocess.run(["localspec"], env=environment(home) | dict(
        _LOCALSPEC_COMPLETE="complete_bash", COMP_WORDS="localspec run qw", COMP_CWORD="2"),
        capture_output=True, text=True, timeout=120)
    assert (asked.returncode, asked.stdout.strip(), asked.stderr) == (0, "", "")
