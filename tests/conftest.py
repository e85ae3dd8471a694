import atexit
import io
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

# localspec reads the GGUF files in the Hugging Face cache in place: the tests see none of this machine's (set before
# huggingface_hub is imported, which reads it once; a test's own processes name a cache of their own)
os.environ["HF_HUB_CACHE"] = tempfile.mkdtemp(prefix="localspec-tests-hf-cache-")
atexit.register(shutil.rmtree, os.environ["HF_HUB_CACHE"], True)

from localspec import paths

from localspec.store import calibration, mirror, registry
from localspec.cli import main
from localspec.engine import backend
from localspec.engine.backend import Context
from localspec.engine.model import Model

from tinymodels import UPPERCASE, TinySpec, tiny_weights, write_tiny_model
from tinymtp import write_tiny_mtp_model
from tinydflash import write_tiny_dflash
from tinyeagle import write_tiny_eagle3
from tinygemma4 import write_tiny_assistant, write_tiny_gemma4

TARGET = TinySpec(seed=1, sharpness=2.0)
TINY_MODELS = {
    "target": TARGET,
    "same": TARGET,  # a separate file with identical weights
    "partial": TinySpec(seed=1, sharpness=2.0, blend_seed=2, blend=0.1),
    "unrelated": TinySpec(seed=2, sharpness=2.0),
    "other_tokenizer": TinySpec(seed=3, sharpness=2.0, pieces=UPPERCASE),
    # LFM2: short-convolution layers (a recurrent state) beside attention; the same tokenizer as the rest
    "hybrid": TinySpec(seed=1, sharpness=2.0, architecture="lfm2"),
    "hybrid_partial": TinySpec(seed=1, sharpness=2.0, blend_seed=2, blend=0.1, architecture="lfm2"),
    # what the tiny EAGLE-3 and DFlash drafters draft for: the next token depends mostly on the last
    "markov_target": TinySpec(seed=1, sharpness=2.0, layer_scale=0.5),
}


@pytest.fixture
def localspec(tmp_path):
    """localspec(*args, stdin=b"") -> the finished CLI subprocess, with a temporary LOCALSPEC_HOME."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("LLAMA_ARG_") and name != "LLAMA_API_KEY"}  # (llama.cpp's settings: read here too)
    env["LOCALSPEC_HOME"] = str(tmp_path / "home")
    env.pop("LOCALSPEC_DEBUG", None)

    def invoke(*args, stdin: bytes = b"", timeout=600):
        return subprocess.run(
            [sys.executable, "-m", "localspec", *map(str, args)],
            input=stdin, capture_output=True, env=env, timeout=timeout,
        )

    return invoke


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    """cli(*args, stdin=b"") -> (exit code, stdout, stderr) of `localspec ARGS` run in this process: for
    argument and input errors, which need no subprocess (and no second start of llama.cpp) to show.

    Standard input is `stdin`, a pipe rather than a terminal, as for the `localspec` fixture's subprocess."""
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("LOCALSPEC_DEBUG", raising=False)
    for name in [name for name in os.environ if name.startswith("LLAMA_ARG_") or name == "LLAMA_API_KEY"]:
        monkeypatch.delenv(name)  # (llama.cpp's settings: read here too)

    def invoke(*args, stdin: bytes = b""):
        monkeypatch.setattr(sys, "argv", ["localspec", *map(str, args)])
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
        with pytest.raises(SystemExit) as exited:
            main()
        captured = capsys.readouterr()
        return exited.value.code, captured.out, captured.err

    return invoke


@pytest.fixture(autouse=True)
def check_caches_after_every_step(monkeypatch):
    """In-process generations check every KV cache after each step, as LOCALSPEC_DEBUG=1 does."""
    monkeypatch.setattr(backend, "CHECK_CACHES", True)


@pytest.fixture(scope="session", autouse=True)
def calibrations_of_the_run(tmp_path_factory):
    """In-process sessions keep auto's costs in a folder of the test run's, not in the user's state
    folder (sessions that a module's tests share included)."""
    with pytest.MonkeyPatch.context() as patch:
        folder = tmp_path_factory.mktemp("state")
        patch.setattr(calibration, "path", lambda: folder / "calibration.json")
        yield


@pytest.fixture(scope="session", autouse=True)
def no_other_apps_models(tmp_path_factory):
    """localspec reads Ollama's, LM Studio's, Jan's, GPT4All's and llama.cpp's models in place: the tests' processes
    see none of this machine's (a test that wants some sets OLLAMA_MODELS, LOCALSPEC_LMSTUDIO_MODELS,
    JAN_DATA_FOLDER, LOCALSPEC_GPT4ALL_MODELS or LLAMA_CACHE to its own)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OLLAMA_MODELS", str(tmp_path_factory.mktemp("no-ollama-models")))
        patch.setenv("LOCALSPEC_LMSTUDIO_MODELS", str(tmp_path_factory.mktemp("no-lmstudio-models")))
        patch.setenv("JAN_DATA_FOLDER", str(tmp_path_factory.mktemp("no-jan-data")))
        patch.setenv("LOCALSPEC_GPT4ALL_MODELS", str(tmp_path_factory.mktemp("no-gpt4all-models")))
        # (llama.cpp's downloads, in the Hugging Face cache's layout or, from older builds, in ~/.cache/llama.cpp)
        patch.setenv("LLAMA_CACHE", str(tmp_path_factory.mktemp("no-llama-cache")))
        yield


@pytest.fixture(autouse=True)
def calibration_of_its_own(tmp_path, monkeypatch):
    """Each test's first session calibrates, as on a new machine and as before costs were kept."""
    monkeypatch.setattr(calibration, "path", lambda: tmp_path / "calibration.json")


@pytest.fixture(scope="module", autouse=True)
def prompt_cache_of_the_module(tmp_path_factory):
    """In-process sessions keep prompts in a folder of their module's (those that its tests share), not in the
    user's cache, where one module's prompts would be read back by another's."""
    with pytest.MonkeyPatch.context() as patch:
        folder = tmp_path_factory.mktemp("prompts")
        patch.setattr(paths, "prompts_dir", lambda: folder)
        yield


@pytest.fixture(autouse=True)
def prompt_cache_of_its_own(tmp_path, monkeypatch):
    """And a test's own sessions in a folder of the test's."""
    monkeypatch.setattr(paths, "prompts_dir", lambda: tmp_path / "prompts")


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """Paths of tiny GGUFs: a target, drafts that agree fully/partly/not at all, another tokenizer."""
    folder = tmp_path_factory.mktemp("tiny-models")
    paths = {name: write_tiny_model(folder / f"{name}.gguf", spec) for name, spec in TINY_MODELS.items()}
    # Qwen3.5-style: a hybrid trunk and one MTP block whose drafts are accepted about half the time
    paths["mtp"] = write_tiny_mtp_model(folder / "mtp.gguf", seed=3, sharpness=4.0, layer_scale=0.5)
    # the same model built without its MTP block, which comes in a sidecar file of its own (Qwen3.6's layout)
    paths["mtp_trunk"] = write_tiny_mtp_model(folder / "trunk.gguf", seed=3, sharpness=4.0, layer_scale=0.5, part="trunk")
    paths["mtp_sidecar"] = write_tiny_mtp_model(folder / "mtp-trunk.gguf", seed=3, sharpness=4.0, layer_scale=0.5,
                                                part="sidecar")
    # an EAGLE-3 drafter for markov_target (as gpt-oss-20b's eagle3- sidecar drafts for it)
    paths["eagle3"] = write_tiny_eagle3(folder / "eagle3-target.gguf", seed=5)
    # a DFlash drafter for markov_target (as Qwen3.6's dflash- sidecar drafts for it)
    paths["dflash"] = write_tiny_dflash(folder / "dflash-target.gguf", tiny_weights(TINY_MODELS["markov_target"]), seed=9)
    # Gemma 4 and the assistant drafter published beside it (ggml-org's mtp-gemma-4-*.gguf)
    paths["gemma4"] = write_tiny_gemma4(folder / "gemma4.gguf", seed=7)
    paths["gemma4_assistant"] = write_tiny_assistant(folder / "mtp-gemma4.gguf", target_seed=7, seed=8)
    return paths


TEMPLATES = Path(__file__).parent / "templates"
# Reasoning families: each one's real chat template (tests/templates/), and the tokens its vocabulary has as
# llama.cpp loads them (markers it shows as text, control tokens it ends generation at or leaves out)
THINKERS = {
    "qwen3": ("qwen3.jinja", ("<think>", "</think>"), ("<|im_start|>", "<|im_end|>")),
    "qwen3.5": ("qwen3.5.jinja", ("<think>", "</think>"), ("<|im_start|>", "<|im_end|>")),
    "deepseek-r1": ("deepseek-r1-distill.jinja", ("<think>", "</think>"),
                    ("<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>")),
    "gpt-oss": ("gpt-oss.jinja", ("<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"),
                ("<|end|>", "<|return|>", "<|call|>")),
    "gemma4": ("gemma4.jinja", ("<|channel>", "<channel|>"), ("<|turn>", "<turn|>", "<|think|>")),
    "minimax-m2": ("minimax-m2.jinja", ("<think>", "</think>", "<minimax:tool_call>", "</minimax:tool_call>"),
                   ("]~!b[", "]~b]", "[e~[")),
    "kimi-k2": ("kimi-k2-thinking.jinja", ("<think>", "</think>"),
                ("<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>",
                 "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                 "<|tool_call_argument_begin|>", "<|tool_call_end|>")),
    "seed-oss": ("seed-oss.jinja", ("<seed:think>", "</seed:think>", "<seed:tool_call>", "</seed:tool_call>"),
                 ("<seed:bos>", "<seed:eos>", "<seed:pad>", "<seed:cot_budget_reflect>", "</seed:cot_budget_reflect>")),
    # (its final response's markers are control tokens, 998 and 999 of its Tekken vocabulary)
    "apriel": ("apriel-1.6.jinja", (),
               ("<|begin_system|>", "<|begin_user|>", "<|begin_assistant|>", "<|end|>", "<|begin_tool_result|>",
                "<|begin_content|>", "[BEGIN FINAL RESPONSE]", "[END FINAL RESPONSE]")),
    "nemotron-nano-v2": ("nemotron-nano-v2.jinja", ("<think>", "</think>"),
                         ("<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>", "<TOOLCALL>", "</TOOLCALL>")),
    "command-r7b": ("command-r7b.jinja", (),
                    ("<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|SYSTEM_TOKEN|>", "<|USER_TOKEN|>",
                     "<|CHATBOT_TOKEN|>", "<|START_THINKING|>", "<|END_THINKING|>", "<|START_ACTION|>", "<|END_ACTION|>",
                     "<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_TOOL_RESULT|>", "<|END_TOOL_RESULT|>")),
    "glm4.5": ("glm4.5.jinja", ("<think>", "</think>"),
               ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>")),
    "deepseek-v3.2": ("deepseek-v3.2.jinja", ("<think>", "</think>", "｜DSML｜"),
                      ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>")),
    "deepseek-v4": ("deepseek-v4.jinja", ("<think>", "</think>", "｜DSML｜"),
                    ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>")),
    "minicpm5": ("minicpm5.jinja", ("<think>", "</think>"), ("<|im_start|>", "<|im_end|>")),
    "apertus": ("apertus.jinja", (),
                ("<|system_start|>", "<|system_end|>", "<|developer_start|>", "<|developer_end|>", "<|user_start|>",
                 "<|user_end|>", "<|assistant_start|>", "<|assistant_end|>", "<|inner_prefix|>", "<|inner_suffix|>",
                 "<|tools_prefix|>", "<|tools_suffix|>")),
    "granite-3.3": ("granite-3.3.jinja", (), ("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>", "<|tool_call|>")),
    # (its GGUFs' control tokens carry their line's end)
    "gigachat3": ("gigachat3.jinja", (), ("<|message_sep|>\n\n", "<|role_sep|>\n")),
    "gigachat3.1": ("gigachat3.1.jinja", (), ("<|message_sep|>\n\n", "<|role_sep|>\n", "<|function_call|>")),
    "functionary-v3.1": ("functionary-v3.1.jinja", (),
                         ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>")),
    "firefunction-v2": ("firefunction-v2.jinja", (), ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")),
    "functionary-v3.2": ("functionary-v3.2.jinja", (), ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")),
    "kimi-k3": ("kimi-k3.jinja", (), ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>")),
    "minimax-m3": ("minimax-m3.jinja", ("<mm:think>", "</mm:think>"), ("]~!b[", "]~b]", "[e~[", "]<]minimax[>[")),
    "hy3": ("hy3.jinja", ("<think:opensource>", "</think:opensource>"),
            ("<｜hy_begin_of_sentence:opensource｜>", "<｜hy_eos:opensource｜>", "<｜hy_User:opensource｜>",
             "<｜hy_Assistant:opensource｜>", "<tool_calls:opensource>", "</tool_calls:opensource>",
             "<tool_call:opensource>", "</tool_call:opensource>", "<tool_sep:opensource>", "<arg_key:opensource>",
             "</arg_key:opensource>", "<arg_value:opensource>", "</arg_value:opensource>")),
    "deepseek-r1-tools": ("deepseek-r1-tools.jinja", ("<think>", "</think>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
                                                      "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"),
                          ("<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>", "<｜tool▁outputs▁begin｜>",
                           "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>")),
    # (with <|calls|> and <|flush|>, llama.cpp ends generation at those, not at <|end|>, which it shows as text)
    "solar-open": ("solar-open.jinja", (),
                   ("<|begin|>", "<|end|>", "<|think|>", "<|content|>", "<|tool_calls|>", "<|tool_call:begin|>",
                    "<|tool_call:name|>", "<|tool_call:args|>", "<|tool_call:end|>", "<|tool_response:begin|>",
                    "<|tool_response:name|>", "<|tool_response:result|>", "<|tool_response:end|>", "<|tool_response|>",
                    "<|calls|>", "<|flush|>", "<|tools:begin|>", "<|tools:end|>", "<|tool:begin|>", "<|tool:end|>")),
    "muse-glimmer": ("muse-glimmer.jinja", (), ("<|start|>", "<|message|>", "<|eom|>", "<|eot|>")),
    "deepseek-v3.1": ("deepseek-v3.1.jinja", ("<think>", "</think>"),
                      ("<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
                       "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<｜tool▁output▁begin｜>",
                       "<｜tool▁output▁end｜>")),
    # (its markers are control tokens of its Tekken vocabulary)
    "ministral-3": ("ministral-3-reasoning.jinja", (),
                    ("[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[THINK]", "[/THINK]", "[TOOL_CALLS]",
                     "[ARGS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]")),
    "minimax-m1": ("minimax-m1.jinja", (), ("<begin_of_document>", "<beginning_of_sentence>", "<end_of_sentence>")),
}


@pytest.fixture(scope="session")
def thinkers(tmp_path_factory) -> dict[str, Path]:
    """Tiny GGUFs that carry each reasoning family's chat template and special tokens (the target's weights)."""
    folder = tmp_path_factory.mktemp("thinkers")
    return {name: write_tiny_model(folder / f"{name}.gguf", replace(TARGET, chat_template=(TEMPLATES / template).read_text(),
                                                                   user_defined=shown, control=control))
            for name, (template, shown, control) in THINKERS.items()}


@pytest.fixture(scope="session")
def load(tiny):
    """load(name, n_ctx=256) -> a Context on a tiny model, closed at the end of the session."""
    opened = []

    def open_context(name: str, n_ctx: int = 256, n_batch: int = 64, backend_sampling: bool = False) -> Context:
        model = Model(tiny[name])
        context = Context(model, n_ctx, n_batch, threads=2, backend_sampling=backend_sampling, max_outputs=n_batch)
        opened.append((context, model))
        return context

    yield open_context
    for context, model in opened:
        context.close()
        model.close()


PROMPT_TEXT = "the cat sat on the mat"


@pytest.fixture(scope="module")
def target(load):
    """A context on the tiny target for the tests of one module.

    Per module, not per session: generations reuse whatever their context's KV cache holds, so a
    shared one would make one module's seeded outcomes depend on which modules ran before it."""
    return load("target")


@pytest.fixture(scope="module")
def branching(tiny):
    """A context on the tiny target with room for draft trees of three branches (per module, as `target`)."""
    model = Model(tiny["target"])
    context = Context(model, 256, 64, threads=2, max_outputs=64, branches=3)
    yield context
    context.close()
    model.close()


@pytest.fixture(scope="module")
def prompt(target):
    """PROMPT_TEXT as the target's tokens, with its start token."""
    return target.model.tokenize(PROMPT_TEXT, add_special=True, parse_special=False)


@pytest.fixture(scope="module")
def served(tiny, tmp_path_factory):
    """serve on the tiny target, named tiny: one server a test module (a module's requests see only its own
    suffix cache), stopped cleanly at its end. A module may define its own served instead."""
    from test_server import ServerProcess

    running = ServerProcess(tmp_path_factory.mktemp("serve"), tiny["target"], "--alias", "tiny", "-c", "512")
    yield running
    assert running.stop() == 0, running.log()


@pytest.fixture(scope="session")
def real_model():
    """real_model(name) -> path of a real GGUF from the registry, fetched once and cached.

    The cache is the user's localspec models directory, or LOCALSPEC_TEST_MODELS.
    """
    cache = Path(os.environ.get("LOCALSPEC_TEST_MODELS") or paths.models_dir())

    def fetch(name: str) -> Path:
        return mirror.fetch(registry.load()[name], cache / name)

    return fetch
