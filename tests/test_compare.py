"""`run --compare`: the speculative run, then the same prompt plainly, side by side."""

import json

from test_cli import check_stats


def test_compare_sets_a_plain_run_of_the_same_prompt_beside_the_speculative_one(localspec, tiny):
    done = localspec("run", tiny["target"], "--draft", tiny["partial"], "--spec", "fixed", "--p-min", "0",
                     "--temp", "0", "-n", "40", "--compare", "--json", "the cat sat on the mat")
    assert done.returncode == 0, done.stderr.decode()
    result = json.loads(done.stdout)
    check_stats(result)
    compared = result["compare"]
    assert compared["plain"]["drafted"] == 0 and compared["plain"]["steps"] >= compared["plain"]["tokens"]
    assert compared["plain"]["tokens"] == result["stats"]["tokens"]  # greedy: the same text, token for token
    assert compared["identical_text"] is True and compared["first_difference"] is None
    assert compared["speedup"] == result["stats"]["tokens_per_second"] / compared["plain"]["tokens_per_second"]
    assert compared["verdict"]


def test_compare_in_a_pipe_prints_the_table_and_verdict_on_stderr(localspec, tiny):
    done = localspec("run", tiny["target"], "--draft", "ngram", "--spec", "fixed", "--temp", "0", "-n", "30",
                     "--compare", "the cat the cat the cat the cat")
    assert done.returncode == 0, done.stderr.decode()
    err = done.stderr.decode()
    assert "tokens/pass" in err and "plain" in err and "identical text" in err
    assert any(word in err for word in ("speculation paid", "no clear difference", "speculation lost",
                                        "nothing was drafted"))
    assert "tokens/pass" not in done.stdout.decode()  # stdout keeps only the text


def test_a_sampled_comparison_says_its_texts_are_two_samples(localspec, tiny):
    done = localspec("run", tiny["target"], "--draft", "ngram", "--temp", "1", "--seed", "3", "-n", "20",
                     "--compare", "the cat")
    assert done.returncode == 0 and "two samples" in done.stderr.decode()


def test_compare_needs_something_to_compare(cli, tiny):
    for flags in (["--no-draft"], ["--spec", "off"], ["-q"]):
        code, _, err = cli("run", tiny["target"], *flags, "--compare", "the cat")
        assert code == 2 and "--compare" in err, (flags, err)


def comparison(spec_speed: float, drafted: int, identical: bool = True, mode="auto", costs=None):
    from dataclasses import replace

    from localspec.compare import Comparison
    from localspec.config import DrafterKind
    from localspec.stats import Recorder

    empty = Recorder().summary()
    plain = replace(empty, tokens=100, steps=100, tokens_per_second=10.0)
    # (an end token drafted and accepted: among the accepted, not among the tokens)
    spec = replace(plain, tokens_per_second=spec_speed, drafted=drafted, accepted=drafted // 2,
                   from_drafts=max(0, drafted // 2 - 1))
    return Comparison(spec, plain, DrafterKind(mode), True, identical, None if identical else 7, costs)


def test_the_verdict_names_what_paid_and_why_nothing_did():
    assert comparison(16.0, 80).verdict().startswith("speculation paid: 1.60x the speed of plain decoding, 39 of 100"
                                                     " tokens from accepted drafts")
    assert comparison(10.2, 80).verdict().startswith("no clear difference (1.02x")
    assert comparison(7.0, 80).verdict().startswith("speculation lost: 0.70x")
    nothing = comparison(9.9, 0, costs={1: 1.0, 4: 2.9}).verdict()
    assert "nothing was drafted" in nothing and "verifying 4 tokens costs 2.9 plain steps" in nothing
    assert "no drafter found anything" in comparison(9.9, 0, mode="ngram").verdict()
    assert "part at character 7" in comparison(16.0, 80, identical=False).text_note()
    # two plain runs at 6.87x read as a speedup beside "nothing was drafted"
    assert comparison(16.0, 80).headline() == "1.60x plain; identical text"
    assert comparison(68.7, 0).headline().startswith("6.87x plain (nothing was drafted: both runs decoded plainly")


def test_penalties_from_the_command_line_keep_the_draft_models_text_the_plain_one(localspec, tiny):
    """llama.cpp's spellings of every penalty, greedy: the speculative text is the plain one, and the
    penalties changed it."""
    penalties = ["--repeat-penalty", "1.5", "--repeat-last-n", "16", "--presence-penalty", "-1",
                 "--frequency-penalty", "0.5"]
    runs = {}
    for name, extra in (("penalised", penalties), ("unpenalised", [])):
        done = localspec("run", tiny["target"], "--draft", tiny["partial"], "--spec", "fixed", "--p-min", "0",
                         "--temp", "0", "-n", "40", "--compare", "--json", *extra, "the cat sat on the mat")
        assert done.returncode == 0, done.stderr.decode()
        runs[name] = json.loads(done.stdout)
    compared = runs["penalised"]["compare"]
    assert compared["identical_text"] is True and runs["penalised"]["stats"]["accepted"] > 0
    assert runs["penalised"]["text"] != runs["unpenalised"]["text"]


def test_ctrl_c_in_the_plain_run_keeps_the_run_made_and_says_there_is_no_comparison(tiny, tmp_path):
    """Ctrl-C during --compare's plain half printed nothing at all with --json (and no summary line without it):
    the finished speculative run was lost with it. (The plain run stops here as Ctrl-C would stop it.)"""
    import os
    import subprocess
    import sys

    script = ("import sys, localspec.compare as compare\n"
              "def stopped(*_):\n    raise KeyboardInterrupt\n"
              "compare.plain_beside = stopped\nfrom localspec.cli.app import main\nsys.argv[0] = 'localspec'\nmain()\n")
    env = {**os.environ, "LOCALSPEC_HOME": str(tmp_path / "home")}
    for as_json in (True, False):
        done = subprocess.run([sys.executable, "-c", script, "run", str(tiny["target"]), "--draft", "ngram", "--temp",
                               "0", "-n", "12", "--compare", *(["--json"] if as_json else []), "the cat"],
                              capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 130 and "Traceback" not in done.stderr, done.stderr
        assert "no comparison" in done.stderr
        if as_json:
            result = json.loads(done.stdout)
            assert result["compare"] == {"interrupted": True} and result["stats"]["tokens"] == 12
        else:
            assert "tok/s" in done.stderr.strip().splitlines()[-1]  # (the run's summary line)
