"""DRY (llama.cpp's "don't repeat yourself" sampler) on the host: each row as llama.cpp's own DRY sampler
leaves it (tests/native_samplers.py), in the tiny model's vocabulary and in real ones; the settings' checks; its
ways in as their clients spell them (llama-server's /completion and the openai client on serve, batch's fields,
llama.cpp's options on the command line). That speculation stays lossless under it is test_lossless.py's."""

import json

import httpx2 as httpx
import numpy as np
import pytest

from localspec.config import Sampling
from localspec.engine.adjustments import Adjustments
from localspec.engine.model import Model
from localspec.errors import UsageError

from native_samplers import dry_row
from test_server import refused_on_both_completions

TEXTS = ("the cat sat on the mat. the cat sat on the mat. the cat sat on the",
         "abc abc abc abc abc abc abc abc abc\nabc abc abc",
         'he said "a cat, a mat" and she said "a cat, a',
         "x: 1\nx: 1\nx: 1\nx: 1\nx:")
SETTINGS = (
    Sampling(dry_multiplier=0.8),  # llama.cpp's defaults but the multiplier
    Sampling(dry_multiplier=1.5, dry_base=2.0, dry_allowed_length=1, dry_sequence_breakers=()),
    Sampling(dry_multiplier=0.5, dry_allowed_length=0, dry_penalty_last_n=12),
    Sampling(dry_multiplier=3.0, dry_base=1.1, dry_allowed_length=3, dry_penalty_last_n=30),
    # breakers of several tokens, whose first token's text may end with a breaker's beginning
    Sampling(dry_multiplier=0.8, dry_sequence_breakers=("cat sat", "said \"", "x: 1\n", "t on")),
    Sampling(dry_multiplier=2.0, dry_base=1000.0),  # a power past float32's range is held at its largest
)


def row_after(model, sampling, before, drafted=()) -> np.ndarray:
    rng = np.random.default_rng(len(before))
    row = rng.normal(0, 2, model.n_vocab).astype(np.float32)
    changed = row.copy()
    Adjustments.of(sampling, model).apply(changed, before, list(drafted))
    return row, changed


def check_as_llama_cpp(model):
    penalised = 0
    for text in TEXTS:
        tokens = model.tokenize(text, add_special=False, parse_special=False)
        for sampling in SETTINGS:
            row, changed = row_after(model, sampling, tokens[:-3], tokens[-3:])
            assert np.array_equal(changed, dry_row(model, sampling, tokens, row)), (text, sampling)
            penalised += int((changed != row).sum())
    assert penalised > 20  # (the texts repeat themselves: DRY had work to do)


def test_dry_changes_a_row_as_llama_cpps_dry_sampler_does(tiny):
    check_as_llama_cpp(Model(tiny["target"], vocab_only=True))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b", "smollm2-135m", "gemma3-270m"])
def test_dry_changes_a_real_models_row_as_llama_cpps_dry_sampler_does(real_model, name):
    check_as_llama_cpp(Model(real_model(name), vocab_only=True))


def test_a_token_that_holds_a_breaker_is_never_penalised_and_a_repeat_starts_after_the_last_breaker():
    # tokens 0..9; 9 breaks alone; 7 then 8 break together
    adjustments = Adjustments(Sampling(dry_multiplier=1.0, dry_base=2.0, dry_allowed_length=2),
                              breakers={9: ((),), 7: ((8,),)})

    def penalties(before):
        row = np.zeros(10, np.float32)
        adjustments.apply(row, before, [])
        return (-row).tolist()

    # "1 2 3" ends the window and came before 4: 4 would make it 4 long, 2 ** (3 - 2); 9 is a breaker
    assert penalties([1, 2, 9, 1, 2, 3, 4, 5, 1, 2, 3]) == [0, 0, 0, 0, 2, 0, 0, 0, 0, 0]
    # a repeat before the last breaker counts too (only its length is held to the tokens after the breaker)
    assert penalties([1, 2, 3, 9, 5, 1, 2, 3, 1, 2, 3]) == [0, 2, 0, 0, 0, 0, 0, 0, 0, 0]
    # two tokens after the breaker: "2 3" repeats, 2 long, which marks 4 by 2 ** 0
    assert penalties([1, 2, 3, 4, 1, 2, 9, 2, 3]) == [0, 0, 0, 0, 1, 0, 0, 0, 0, 0]
    assert penalties([1, 2, 3, 4, 1, 2, 3, 9, 3]) == [0] * 10  # one token after the breaker: nothing to repeat
    assert penalties([1, 2, 3, 4, 1, 2, 7, 8, 3]) == [0] * 10  # 7 8 breaks as 9 does
    assert penalties([1, 2, 3, 4, 1, 2, 7, 3, 1, 2, 3]) == [0] * 4 + [2.0] + [0] * 5  # 7 alone does not


def test_dry_leaves_tokens_outside_a_shorter_vocabulary_alone():
    row = np.zeros(4, np.float32)  # a draft model's row: 6 is past its end
    Adjustments(Sampling(dry_multiplier=1.0, dry_allowed_length=1)).apply(row, [1, 6, 2, 1], [])
    assert row.tolist() == [0, 0, 0, 0]
    Adjustments(Sampling(dry_multiplier=1.0, dry_allowed_length=1)).apply(row, [1, 3, 2, 1], [])
    assert row.tolist() == [0, 0, 0, -1]


def test_dry_comes_after_the_penalties_and_counts_only_where_it_changes_a_logit():
    s = Sampling(repeat_penalty=2.0, dry_multiplier=1.0, dry_allowed_length=1, dry_sequence_breakers=())
    row = np.array([4.0, 4.0, 4.0], np.float32)
    Adjustments(s).apply(row, [1, 2, 1], [])  # 1 and 2 halved, then 2 (after "1") lowered by 1 ** 0
    assert row.tolist() == [4.0, 2.0, 1.0]
    assert not Sampling(dry_multiplier=0.0).adjusted and not Sampling(dry_multiplier=1.0, dry_penalty_last_n=0).dry
    assert Sampling(dry_multiplier=0.5).adjusted
    assert Sampling(dry_sequence_breakers=["\n", ""]).dry_sequence_breakers == ("\n",)


@pytest.mark.parametrize("wrong, setting", [
    ({"dry_multiplier": float("nan")}, "dry_multiplier"), ({"dry_multiplier": 1, "dry_base": 0.5}, "dry_base"),
    ({"dry_allowed_length": -1}, "dry_allowed_length"), ({"dry_penalty_last_n": -2}, "dry_penalty_last_n"),
    ({"dry_sequence_breakers": "\n"}, "dry_sequence_breakers"),
    ({"dry_sequence_breakers": [1]}, "dry_sequence_breakers"),
])
def test_dry_settings_that_mean_nothing_are_refused_naming_the_setting(wrong, setting):
    with pytest.raises(UsageError) as refused:
        Sampling(**wrong)
    assert refused.value.setting == setting
    Sampling(dry_base=0.5)  # (a base below 1 means nothing only while DRY is on)


PROMPT = "the cat sat"
# hard on every token seen before (allowed length 0): the tiny target's greedy answer repeats itself at its
# 13th token ("99 115"), which this turns down
DRIED = {"dry_multiplier": 100.0, "dry_base": 1.5, "dry_allowed_length": 0, "dry_penalty_last_n": -1,
         "dry_sequence_breakers": ["z"]}


def completion(server, **asked) -> dict:
    answer = httpx.post(server.base + "/completion", timeout=60,
                        json={"prompt": PROMPT, "n_predict": 24, "temperature": 0} | asked)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_llama_servers_dry_through_completion_and_the_openai_client(served):
    plain, dried = completion(served), completion(served, **DRIED)
    assert dried["content"] != plain["content"]
    assert dried["content"] == completion(served, **DRIED, speculative={"mode": "off"})["content"]
    settings = dried["generation_settings"]
    assert {name: settings[name] for name in DRIED} == DRIED and "dry" in settings["samplers"]
    defaults = httpx.get(served.base + "/props", timeout=60).json()["default_generation_settings"]["params"]
    assert defaults["dry_multiplier"] == 0 and defaults["dry_sequence_breakers"] == ["\n", ":", "\"", "*"]
    # llama-server takes them on its OpenAI routes too; so does serve
    answer = served.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0,
                                                extra_body=DRIED)
    assert answer.choices[0].text == dried["content"]
    refused_on_both_completions(served, PROMPT, (
        ({"dry_multiplier": 1, "dry_base": 0.5}, "dry base must be >= 1"),
        ({"dry_allowed_length": -1}, "dry_allowed_length"),
        ({"dry_sequence_breakers": "\n"}, "dry_sequence_breakers"),
        ({"dry_multiplier": "much"}, "dry_multiplier"),
    ))
    assert "Traceback" not in served.log()


def test_batch_items_and_the_command_line_take_dry_as_llama_cpp_spells_it(localspec, cli, tiny, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "dried", "prompt": PROMPT, "temperature": 0, "max_tokens": 24, **DRIED}) + "\n"
                       + json.dumps({"id": "plain", "prompt": PROMPT, "temperature": 0, "max_tokens": 24}) + "\n")
    done = localspec("batch", tiny["target"], prompts, "--raw")
    assert done.returncode == 0, done.stderr.decode()
    records = {record["id"]: record for record in map(json.loads, done.stdout.decode().splitlines())}
    assert records["dried"]["text"] != records["plain"]["text"], records
    options = ["--dry-multiplier", "100", "--dry-base", "1.5", "--dry-allowed-length", "0",
               "--dry-penalty-last-n", "-1"]
    for breakers in (["--dry-sequence-breaker", "z"],
                     ["--dry-sequence-breaker", "none", "--dry-sequence-breaker", "z"]):
        code, stdout, stderr = cli("run", tiny["target"], "-p", PROMPT, "--raw", "--temp", "0", "-n", "24", *options,
                                   *breakers, "--json")
        assert code == 0 and json.loads(stdout)["text"] == records["dried"]["text"], stderr
    for wrong, said in ((["--dry-multiplier", "1", "--dry-base", "0.5"], "dry base must be >= 1"),
                        (["--dry-penalty-last-n", "-2"], "dry penalty last n must be >= 0, or -1")):
        code, stdout, stderr = cli("run", tiny["target"], "-p", PROMPT, "-n", "2", *wrong)
        errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
        assert code == 2 and stdout == "" and len(errors) == 1 and said in errors[0], stderr


def test_the_command_lines_breakers_are_read_as_llama_cpp_reads_them():
    from localspec.cli.options import _breakers

    assert _breakers(None) == ("\n", ":", "\"", "*")
    assert _breakers(["\\n", "*"]) == ("\n", "*") and _breakers(["a", "none", "b"]) == ("b",)
    assert _breakers(["none"]) == ()
