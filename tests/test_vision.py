"""Images read through the target's multimodal projector (llama.cpp's --mmproj; libmtmd), on tiny real projectors
(LLaVA's and Gemma 3's): the prompt and answer libmtmd's own helpers make, every drafter keeping the target's text
with an image in the prompt, a later turn finding it cached (not encoded again), images through run, chat, batch
and serve's four APIs by their real clients, and refusals that say what to do."""

import base64
import ctypes
import http.server
import json
import re
import threading
from dataclasses import replace

import numpy as np
import pytest

from localspec.chat_template import render
from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation
from localspec.engine.vision import image_start, media_runs
from localspec.errors import InputError, ModelLoadError, UsageError
from localspec.events import Prefill, Token
from localspec.prompts import FALLBACK_TEMPLATE, MEDIA_MARKER
from localspec.request import IMAGE_MARKER, Request, from_wire, to_wire
from localspec.session import Session

from tinymodels import TinySpec, write_tiny_model
from tinyqwenvl import write_tiny_qwen2vl, write_tiny_qwen2vl_mmproj
from tinyvision import GEMMA3_IMAGE_TEXT, GEMMA3_IMAGE_TOKENS, IMAGE_TOKENS, random_image, write_tiny_mmproj

RED, BLUE = random_image(1), random_image(2)


@pytest.fixture(scope="module")
def mmproj(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vision")
    return {"fits": write_tiny_mmproj(folder / "mmproj.gguf"),
            "narrow": write_tiny_mmproj(folder / "narrow.gguf", width=48),
            # Gemma 3's: an image's rows read each other both ways, between <start_of_image> and <end_of_image>
            "gemma3": write_tiny_mmproj(folder / "mmproj-gemma3.gguf", projector="gemma3"),
            "gemma3_text": write_tiny_model(folder / "gemma3-text.gguf", TinySpec(
                seed=1, sharpness=2.0, user_defined=GEMMA3_IMAGE_TEXT)),
            # Qwen2-VL's: an image's rows placed by M-RoPE on a grid of fewer positions than rows
            "qwen2vl": write_tiny_qwen2vl_mmproj(folder / "mmproj-qwen2vl.gguf"),
            "qwen2vl_text": write_tiny_qwen2vl(folder / "qwen2vl-text.gguf")}


def opened(tiny, mmproj, draft: str | None = None, mode=DrafterKind.PLAIN, **runtime) -> Session:
    return Session(tiny["target"], tiny[draft] if draft else None,
                   Runtime(ctx_size=512, mmproj=str(mmproj["fits"]), **runtime), Speculation(drafting=mode))


def asked(session: Session, *images: bytes, text: str = "what is in the picture", n: int = 24,
          earlier: tuple = ()) -> tuple[list[int], Prefill]:
    messages = [*earlier, {"role": "user", "content": text, "images": list(images)}]
    events = list(session.generate(Request(Sampling(temperature=0), Limits(n), messages=messages)))
    return [e.id for e in events if isinstance(e, Token)], next(e for e in events if isinstance(e, Prefill))


def test_an_image_is_read_and_every_drafter_keeps_the_targets_text(tiny, mmproj):
    with opened(tiny, mmproj) as session:
        red = asked(session, RED)[0]
        assert red != asked(session, BLUE)[0] != asked(session)[0]
        assert asked(session, RED)[0] == red
    for draft, mode in ((None, DrafterKind.NGRAM), ("partial", DrafterKind.DRAFT), ("partial", DrafterKind.AUTO)):
        with opened(tiny, mmproj, draft, mode) as session:
            assert asked(session, RED)[0] == red, (draft, mode)


@pytest.mark.parametrize("kind", ["mlp", "gemma3", "qwen2vl"])
def test_the_prompt_and_its_answer_are_those_llama_cpps_own_multimodal_helpers_make(tiny, mmproj, kind):
    """libmtmd's own path (mtmd_tokenize, then mtmd_helper_eval_chunks, as llama-server and llama-mtmd-cli read a
    prompt) as the reference: the same tokens around the image, the same positions, the same greedy answer.
    Gemma 3's image is read without a causal mask, in one batch (its rows read causally gave another answer);
    Qwen2-VL's rows at M-RoPE's positions, 12 rows on 4 positions (refused before)."""
    model, projector = {"mlp": (tiny["target"], mmproj["fits"]), "gemma3": (mmproj["gemma3_text"], mmproj["gemma3"]),
                        "qwen2vl": (mmproj["qwen2vl_text"], mmproj["qwen2vl"])}[kind]
    with Session(model, None, Runtime(ctx_size=512, mmproj=str(projector)), Speculation(drafting=DrafterKind.PLAIN)) \
            as session:
        look = [{"role": "user", "content": "look", "images": [RED]}]
        tokens = session.prepare(Request(messages=look)).tokens
        events = session.generate(Request(Sampling(temperature=0, logprobs=0), Limits(10), messages=look))
        answer, logprobs = zip(*[(e.id, e.logprobs.chosen.logprob) for e in events if isinstance(e, Token)])
        prompts = session.prompts  # (the conversation as its template writes it, the image where libmtmd's marker is)
        text = render(prompts.template, [{"role": "user", "content": MEDIA_MARKER + "look"}], "", "")
    layout, reference, their_logprobs = libmtmd_greedy(model, projector, text, RED, 10)
    ours = [("image", end - start) if image else tokens[start:end] for start, end, image in media_runs(tokens)]
    assert layout == ours and ("image", {"mlp": IMAGE_TOKENS, "gemma3": GEMMA3_IMAGE_TOKENS, "qwen2vl": 3}[kind]) in ours
    # (the rows each token was chosen from, not only the choices: a tiny model's argmax hides much)
    assert list(answer) == reference and np.allclose(logprobs, their_logprobs, atol=1e-3), (logprobs, their_logprobs)


def libmtmd_greedy(model_path, projector_path, text: str, image: bytes, n: int, n_ctx: int = 512,
                   n_batch: int = 64, last_alone: bool = False) -> tuple[list, list[int], list[float]]:
    """text (MEDIA_MARKER where the image goes) as libmtmd tokenizes it ([token ids] of each text chunk, ("image",
    positions) of the image's, ("audio", positions) of each of an audio file's), the n tokens greedy decoding writes
    after mtmd_helper_eval_chunks reads it, and each one's log probability. last_alone: the prompt's last token read
    again by itself, as localspec's first step reads it (a batch of one sums a long cache's attention in another
    order: 750 audio rows moved the first log probability by 0.009)."""
    from llama_cpp import mtmd_cpp as mtmd

    from localspec.engine.library import llama

    params = llama.llama_model_default_params()
    params.n_gpu_layers = 0
    model = llama.llama_model_load_from_file(str(model_path).encode(), params)
    settings = mtmd.mtmd_context_params_default()
    settings.use_gpu, settings.print_timings, settings.n_threads = False, False, 2
    vision = mtmd.mtmd_init_from_file(str(projector_path).encode(), model, settings)
    contexts = llama.llama_context_default_params()
    contexts.n_ctx, contexts.n_batch, contexts.n_ubatch, contexts.n_threads = n_ctx, n_batch, n_batch, 2
    context = llama.llama_init_from_model(model, contexts)
    buffer = (ctypes.c_uint8 * len(image)).from_buffer_copy(image)
    bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(vision, buffer, len(image), False)
    chunks = mtmd.mtmd_input_chunks_init()
    try:
        encoded = text.encode()
        given = mtmd.mtmd_input_text(encoded, len(encoded), True, True)
        assert mtmd.mtmd_tokenize(vision, chunks, ctypes.byref(given), (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) == 0
        layout = []
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                count = ctypes.c_size_t()
                ids = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
                layout.append([ids[j] for j in range(count.value)])
            else:
                audio = mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_AUDIO
                layout.append(("audio" if audio else "image", mtmd.mtmd_input_chunk_get_n_pos(chunk)))
        read = llama.llama_pos(0)
        assert mtmd.mtmd_helper_eval_chunks(vision, context, chunks, 0, 0, n_batch, True, ctypes.byref(read)) == 0
        n_vocab = llama.llama_vocab_n_tokens(llama.llama_model_get_vocab(model))
        written, logprobs, batch = [], [], llama.llama_batch_init(1, 0, 1)
        if last_alone:
            read.value -= 1
            assert llama.llama_memory_seq_rm(llama.llama_get_memory(context), 0, read.value, -1)
            batch.n_tokens, batch.token[0], batch.pos[0], batch.n_seq_id[0], batch.logits[0] = (
                1, layout[-1][-1], read.value, 1, True)
            batch.seq_id[0][0] = 0
            read.value += 1
            assert llama.llama_decode(context, batch) == 0
        for _ in range(n):  # (at the positions after what was read: an M-RoPE image's rows share one in the cache)
            row = np.ctypeslib.as_array(llama.llama_get_logits_ith(context, -1), shape=(n_vocab,)).astype(np.float64)
            written.append(int(row.argmax()))
            logprobs.append(float(row[written[-1]] - row.max() - np.log(np.exp(row - row.max()).sum())))
            batch.n_tokens, batch.token[0], batch.pos[0], batch.n_seq_id[0], batch.logits[0] = (
                1, written[-1], read.value, 1, True)
            batch.seq_id[0][0] = 0
            read.value += 1
            assert llama.llama_decode(context, batch) == 0
        llama.llama_batch_free(batch)
        return layout, written, logprobs
    finally:
        mtmd.mtmd_input_chunks_free(chunks)
        mtmd.mtmd_bitmap_free(bitmap)
        llama.llama_free(context)
        mtmd.mtmd_free(vision)
        llama.llama_model_free(model)


def test_a_drafter_that_copies_from_the_prompt_never_proposes_an_images_rows(tiny, mmproj):
    # the prompt ends as the fallback template's turn does ("Assistant:"), which the message wrote before its image:
    # n-gram lookup finds the image's rows where it would copy a continuation from
    text = f"Assistant:{IMAGE_MARKER} and Assistant:{IMAGE_MARKER}"
    with opened(tiny, mmproj) as session:
        plain = asked(session, RED, BLUE, text=text)[0]
    with opened(tiny, mmproj, mode=DrafterKind.NGRAM) as session:
        assert asked(session, RED, BLUE, text=text)[0] == plain


def test_an_image_takes_its_rows_in_the_prompt_and_a_later_turn_finds_it_cached(tiny, mmproj):
    with opened(tiny, mmproj) as session:
        tokens = session.prepare(Request(messages=[{"role": "user", "content": "look", "images": [RED]}])).tokens
        rows = [token for token in tokens if token < 0]
        assert len(rows) == IMAGE_TOKENS and tokens.index(rows[0]) + IMAGE_TOKENS == tokens.index(rows[-1]) + 1
        _, first = asked(session, RED, text="look")
        assert session.vision.encodings == 1 and first.reused_tokens == 0
        earlier = ({"role": "user", "content": "look", "images": [RED]}, {"role": "assistant", "content": "a cat"})
        _, second = asked(session, text="and now", earlier=earlier)
        assert second.reused_tokens > tokens.index(rows[-1]) and session.vision.encodings == 1  # cached, not read again
        assert session.placement()["target"]["mmproj"] == str(mmproj["fits"]) and "+ mmproj.gguf" in session.describe()


def test_images_are_placed_where_the_content_says_and_before_it_otherwise(tiny, mmproj):
    with opened(tiny, mmproj) as session:
        def tokens(content, images):
            return session.prepare(Request(messages=[{"role": "user", "content": content, "images": images}])).tokens

        before = tokens("look", [RED])
        placed = tokens(f"look {IMAGE_MARKER}", [RED])
        assert before != placed and sorted(before) == sorted(tokens(f"{IMAGE_MARKER}look", [RED]))
        # the images in order: those the content does not place (RED) before its text, then BLUE at its marker
        both = tokens(f"a {IMAGE_MARKER} b", [RED, BLUE])
        red, blue = [t for t in before if t < 0], [t for t in tokens("look", [BLUE]) if t < 0]
        assert both.index(red[0]) + IMAGE_TOKENS < both.index(blue[0]) and red != blue
        assert both[both.index(red[-1]) + 1 : both.index(blue[0])] == session.target_model.tokenize(
            "a ", add_special=False, parse_special=False)
        with pytest.raises(InputError, match="places 2 images but carries 1"):
            tokens(f"{IMAGE_MARKER}{IMAGE_MARKER}", [RED])


def test_an_earlier_exchanges_tokens_handed_back_hold_its_image(tiny, mmproj):
    # Ollama's generate hands back `context`, the prompt's tokens and the answer's, for the next prompt to go on from
    with opened(tiny, mmproj) as session:
        first = session.prepare(Request(messages=[{"role": "user", "content": "look", "images": [RED]}])).tokens
        going_on = Request(Sampling(temperature=0), Limits(8), messages=[{"role": "user", "content": "and now"}],
                           continues=first)
        assert session.prepare(going_on).tokens[: len(first)] == first
        assert [e for e in session.generate(going_on) if isinstance(e, Token)]
        with pytest.raises(InputError, match="token ids"):
            session.prepare(replace(going_on, continues=[-(1 << 20), *first]))  # no image this process has read


def test_what_is_no_image_and_a_model_without_a_projector_are_refused(tiny, mmproj):
    with opened(tiny, mmproj) as session:
        with pytest.raises(InputError, match="image 2 is not an image llama.cpp reads"):
            asked(session, RED, b"GIF89a? no")
        assert asked(session, RED)[0]  # and it goes on
    with Session(tiny["target"], None, Runtime(ctx_size=512), Speculation(drafting=DrafterKind.PLAIN)) as plain:
        with pytest.raises(UsageError, match=r"reads no images: load it with its multimodal projector \(--mmproj"):
            asked(plain, RED)
    with pytest.raises(ModelLoadError, match=r"mismatch between text model \(n_embd = 64\) and mmproj \(n_embd = 48\)"):
        Session(tiny["target"], None, Runtime(ctx_size=512, mmproj=str(mmproj["narrow"])),
                Speculation(drafting=DrafterKind.PLAIN))
    with pytest.raises(ModelLoadError, match="multimodal projector"):
        Session(tiny["target"], None, Runtime(ctx_size=512, mmproj=str(tiny["partial"])),
                Speculation(drafting=DrafterKind.PLAIN))


def test_parallel_sequences_read_their_images_each(tiny, mmproj):
    with opened(tiny, mmproj) as alone:
        red, blue = asked(alone, RED)[0], asked(alone, BLUE)[0]
    with opened(tiny, mmproj, "partial", DrafterKind.DRAFT, parallel=2) as session:
        scheduler = session.scheduler()
        for image in (RED, BLUE):
            scheduler.add(Request(Sampling(temperature=0), Limits(24), messages=[
                {"role": "user", "content": "what is in the picture", "images": [image]}]))
        answers: dict = {}
        while scheduler:
            for running, item in scheduler.step():
                if isinstance(item, Token):
                    answers.setdefault(running.sequence, []).append(item.id)
                assert not isinstance(item, Exception), item
        assert sorted(answers.values()) == sorted([red, blue])


def test_images_travel_to_a_serve_as_base64_and_back():
    request = Request(messages=[{"role": "user", "content": "look", "images": [RED, BLUE]}])
    wire = json.loads(json.dumps(to_wire(request)))
    assert wire["messages"][0]["images"] == [base64.b64encode(RED).decode(), base64.b64encode(BLUE).decode()]
    assert from_wire(wire).messages == request.messages
    with pytest.raises(UsageError, match="an image is base64 text"):
        from_wire(wire | {"messages": [{"role": "user", "content": "x", "images": ["@@"]}]})


def test_runs_split_text_from_each_image_and_a_cache_keeps_no_image_in_part():
    image, other = [-1, -2, -3], [-16385, -16386]
    tokens = [5, 6, *image, *other, 7]
    assert media_runs(tokens) == [(0, 2, False), (2, 5, True), (5, 7, True), (7, 8, False)]
    assert media_runs([]) == []
    assert [image_start(tokens, n) for n in range(9)] == [0, 1, 2, 2, 2, 5, 5, 7, 8]


@pytest.fixture(scope="module")
def served(tiny, mmproj, tmp_path_factory):
    from test_server import ServerProcess

    running = ServerProcess(tmp_path_factory.mktemp("serve"), tiny["target"], "--alias", "tiny", "-c", "512", "-np",
                            "2", "--draft", tiny["partial"], "--mmproj", mmproj["fits"])
    yield running
    assert running.stop() == 0, running.log()


def _data_url(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode()


def test_serve_reads_images_from_openais_parts_ollamas_images_and_a_url(served, tiny, mmproj):
    import anthropic
    import httpx
    import ollama

    with opened(tiny, mmproj) as session:
        def chatted(text: str) -> str:
            return session.chat(sampling=Sampling(temperature=0), limits=Limits(16)).send(text, [RED]).text

        # OpenAI's parts are the message's lines, the image one of them; Ollama's images go before its text
        alone, before = chatted(f"{IMAGE_MARKER}\nwhat is it"), chatted("what is it")
    client = served.client()

    def asked(*parts: dict, text: str = "what is it") -> str:
        return client.chat.completions.create(model="tiny", max_tokens=16, temperature=0, messages=[
            {"role": "user", "content": [*parts, {"type": "text", "text": text}]}]).choices[0].message.content

    red = asked({"type": "image_url", "image_url": {"url": _data_url(RED)}})
    assert red == alone and red != asked({"type": "image_url", "image_url": {"url": _data_url(BLUE)}})
    with ImageServer(RED) as url:  # fetched, as llama-server fetches one
        assert asked({"type": "image_url", "image_url": {"url": url}}) == red
    responded = client.responses.create(model="tiny", max_output_tokens=16, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_image", "image_url": _data_url(RED)},
                                     {"type": "input_text", "text": "what is it"}]}])
    assert responded.output_text == red
    anthropics = anthropic.Anthropic(base_url=served.base, api_key="unused", max_retries=0)
    image = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(RED).decode()}
    answered = anthropics.messages.create(model="tiny", max_tokens=16, extra_body={"temperature": 0}, messages=[
        {"role": "user", "content": [{"type": "image", "source": image}, {"type": "text", "text": "what is it"}]}])
    assert answered.content[0].text == red
    # LM Studio's SDK uploads the image on one socket (prepare_image) and names it in a chat on another
    import lmstudio as lms

    with lms.Client(served.base.removeprefix("http://")) as sdk:
        chat = lms.Chat()
        chat.add_user_message("what is it", images=[sdk.prepare_image(RED, name="red.png")])
        seen = sdk.llm.model("tiny").respond(chat, config={"maxTokens": 16, "temperature": 0}).content
    text_first = client.chat.completions.create(model="tiny", max_tokens=16, temperature=0, messages=[
        {"role": "user", "content": [{"type": "text", "text": "what is it"},
                                     {"type": "image_url", "image_url": {"url": _data_url(RED)}}]}])
    assert seen == text_first.choices[0].message.content

    ollamas = ollama.Client(host=served.base)
    options = {"temperature": 0, "num_predict": 16}
    assert ollamas.chat(model="tiny", messages=[{"role": "user", "content": "what is it", "images": [RED]}],
                        options=options).message.content == before
    assert ollamas.generate(model="tiny", prompt="what is it", images=[RED], options=options).response == before
    assert "vision" in ollamas.show("tiny").capabilities
    rendered = httpx.post(served.base + "/api/generate", json={"model": "tiny", "prompt": "what is it",
                                                               "images": [base64.b64encode(RED).decode()],
                                                               "_debug_render_only": True}, timeout=60).json()
    assert rendered["debug_info"]["image_count"] == 1 and "<__media__>" in rendered["debug_info"]["rendered_template"]
    # llama-server's way: /props says it sees and names its marker, /apply-template writes a chat's prompt with it,
    # /completion reads a prompt so written with the images as multimodal_data: the chat's answer (the prompt as
    # the template writes it: a SentencePiece vocabulary's pieces put a space before /apply-template's text)
    props = httpx.get(served.base + "/props", timeout=30).json()
    assert props["modalities"]["vision"] is True and props["media_marker"] == MEDIA_MARKER
    chat = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": _data_url(RED)}},
                                         {"type": "text", "text": "what is it"}]}]
    applied = httpx.post(served.base + "/apply-template", json={"messages": chat}, timeout=30).json()["prompt"]
    prompt = render(FALLBACK_TEMPLATE, [{"role": "user", "content": f"{MEDIA_MARKER}\nwhat is it"}], "", "")
    assert applied.count(MEDIA_MARKER) == 1
    completed = httpx.post(served.base + "/completion", timeout=60, json={
        "prompt": {"prompt_string": prompt, "multimodal_data": [base64.b64encode(RED).decode()]}, "n_predict": 16,
        "temperature": 0})
    assert completed.status_code == 200 and completed.json()["content"] == red, completed.text
    refused = httpx.post(served.base + "/completion", timeout=60, json={
        "prompt": {"prompt_string": prompt, "multimodal_data": []}, "n_predict": 4})
    assert refused.status_code == 400 and "places 1 images (<__media__>) but carries 0" in refused.text
    deaf = httpx.post(served.url + "/audio/transcriptions", files={"file": ("a.wav", b"RIFF")}, timeout=60)
    assert deaf.status_code == 400 and "reads no audio" in deaf.json()["error"]["message"], deaf.text
    assert "Traceback" not in served.log()


@pytest.mark.parametrize(("part", "said"), [
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}, "messages.0.content.0.image_url: not"
                                                                               " base64 text"),
    ({"type": "image_url", "image_url": {"url": _data_url(b"GIF89a? no")}}, "image 1 is not an image llama.cpp reads"),
    ({"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/none.png"}}, "could not fetch"),
    ({"type": "file", "file": {"file_data": "", "filename": "a.pdf"}}, "only text, image_url and input_audio parts"),
])
def test_an_image_that_cannot_be_read_is_a_400_naming_it(served, part, said):
    import openai

    with pytest.raises(openai.BadRequestError, match=re.escape(said)):
        served.client().chat.completions.create(model="tiny", max_tokens=4, messages=[
            {"role": "user", "content": [part, {"type": "text", "text": "what is it"}]}])
    assert served.client().chat.completions.create(model="tiny", max_tokens=2, messages=[
        {"role": "user", "content": "still there?"}]).choices[0].message.content is not None


class ImageServer:
    """An HTTP server on 127.0.0.1 that hands out one image, at the URL `with` gives."""

    def __init__(self, image: bytes):
        self.image = image

    def __enter__(self) -> str:
        image = self.image

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(image)))
                self.end_headers()
                self.wfile.write(image)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}/cat.png"

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_run_and_chat_read_an_image_named_by_option_command_or_path_as_ollama_reads_one(cli, tiny, mmproj, tmp_path):
    image = tmp_path / "cat.png"
    image.write_bytes(RED)
    loaded = ("--mmproj", mmproj["fits"], "-n", "12", "--temp", "0", "--no-draft")

    def run(*args) -> str:
        code, out, err = cli("run", tiny["target"], *loaded, "-q", *args)
        assert code == 0, err
        return out

    by_option = run("--image", image, "-p", "what is it")
    assert by_option == run("-p", f"what is it {image}") != run("-p", "what is it")
    assert run("-p", f"what is it {tmp_path / 'none.png'}") != by_option  # (no such file: the path stays text)
    saved = tmp_path / "chat.json"
    code, out, err = cli("chat", tiny["target"], *loaded, stdin=f"/image {image}\nwhat is it\n/save {saved}\n"
                                                                 f"/clear\n/load {saved}\n/save {saved}\n".encode())
    assert code == 0 and out.startswith("image ") and by_option.splitlines()[0] in out.splitlines(), err
    kept = json.loads(saved.read_text())  # (saved, loaded and saved again: the image went both ways)
    assert [message.get("images") for message in kept] == [[base64.b64encode(RED).decode()], None]

    code, _, err = cli("run", tiny["target"], "-p", "x", "--image", image)
    assert code == 2 and "reads no images: load it with its multimodal projector (--mmproj FILE)" in err
    code, out, _ = cli("chat", tiny["target"], "-n", "4", stdin=f"/image {image}\nhi\n".encode())
    assert code == 0 and "this model reads no images: start it with its multimodal projector" in out
    for args, said in ((("--image", tmp_path / "none.png"), "--image"),
                       (("--image", tiny["target"]), "image 1 is not an image llama.cpp reads"),
                       (("--image", image, "--raw"), "--image goes in the chat template's turn")):
        code, _, err = cli("run", tiny["target"], *loaded, "-p", "x", *args)
        assert code == 2 and said in err and "Traceback" not in err, err


def test_batch_items_carry_images_by_path_or_base64(localspec, tiny, mmproj, tmp_path):
    image = tmp_path / "cat.png"
    image.write_bytes(RED)
    loaded = ("--mmproj", mmproj["fits"], "--temp", "0", "--no-draft", "-n", "12")
    done = localspec("run", tiny["target"], *loaded, "--image", image, "-p", "what is it", "--json")
    assert done.returncode == 0, done.stderr.decode()
    expected = json.loads(done.stdout)["text"]
    encoded = base64.b64encode(RED).decode()
    asked = [{"id": "path", "prompt": "what is it", "images": [str(image)]},
             {"id": "base64", "prompt": "what is it", "images": [encoded]},
             {"id": "message", "messages": [{"role": "user", "content": "what is it", "images": [encoded]}]},
             {"id": "blue", "prompt": "what is it", "images": [base64.b64encode(BLUE).decode()]},
             {"id": "none", "prompt": "what is it", "images": ["no such file, nor base64!"]},
             {"id": "lone", "messages": [{"role": "user", "content": "x"}], "images": [encoded]}]
    (tmp_path / "items.jsonl").write_text("".join(json.dumps(item | {"max_tokens": 12}) + "\n" for item in asked))
    done = localspec("batch", tiny["target"], tmp_path / "items.jsonl", *loaded, "--parallel", "2")
    records = {record["id"]: record for record in map(json.loads, done.stdout.decode().splitlines())}
    assert records["path"]["text"] == records["base64"]["text"] == records["message"]["text"] == expected
    assert records["blue"]["text"] != expected
    assert "is neither a file nor base64 text" in records["none"]["error"]
    assert "'images' go with a 'prompt'" in records["lone"]["error"] and done.returncode != 0


def test_a_projector_named_as_a_model_says_what_it_is_and_how_to_use_it(cli, tiny, mmproj):
    said = "mmproj.gguf is a multimodal projector, not a model: run the model it was made for with --mmproj"
    for args in (("run", mmproj["fits"], "-p", "x"), ("run", tiny["target"], "--draft", mmproj["fits"], "-p", "x")):
        code, _, err = cli(*args)
        assert code == 2 and said in err and "Traceback" not in err, err
    code, out, _ = cli("show", mmproj["fits"])
    assert code == 0 and "a multimodal projector, not a model" in out and "--mmproj" in out


def test_a_modelfiles_second_from_is_its_projector_as_ollama_makes_a_llava(localspec, cli, tiny, mmproj, tmp_path):
    import ollama

    from test_server import ServerProcess

    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "mmproj.gguf").write_bytes(mmproj["fits"].read_bytes())
    image = folder / "cat.png"
    image.write_bytes(RED)
    for order in ((tiny["target"], "./mmproj.gguf"), ("./mmproj.gguf", tiny["target"])):  # (Ollama takes either)
        (folder / "Modelfile").write_text(f"FROM {order[0]}\nFROM {order[1]}\nPARAMETER temperature 0\n")
        assert localspec("create", "seeing", "-f", folder / "Modelfile").returncode == 0
        assert localspec("show", "seeing", "--modelfile").stdout.decode().startswith(
            f"FROM {tiny['target']}\nFROM {folder / 'mmproj.gguf'}\n")
    assert "projector" in localspec("show", "seeing").stdout.decode()

    def text(*args) -> str:
        done = localspec("run", *args, "--image", image, "-p", "what is it", "-n", "12", "--temp", "0", "--json")
        assert done.returncode == 0, done.stderr.decode()
        return json.loads(done.stdout)["text"]

    seen = text("seeing")
    assert seen == text(tiny["target"], "--mmproj", mmproj["fits"])

    server = ServerProcess(tmp_path / "home", tiny["target"], "--alias", "tiny", "-c", "512")
    try:
        client = ollama.Client(host=server.base)

        def answer(model: str) -> str:
            return client.chat(model, [{"role": "user", "content": "what is it", "images": [RED]}],
                               options={"temperature": 0, "num_predict": 12}).message.content

        assert answer("seeing") == seen  # (the same file, loaded a second time with the projector)
        with pytest.raises(ollama.ResponseError, match="reads no images"):
            answer("tiny")
        # as Ollama's clients send a llava's two files: uploaded, then named in files
        files = {"model.gguf": client.create_blob(tiny["target"]), "mmproj.gguf": client.create_blob(mmproj["fits"])}
        assert client.create("seeing-too", files=files).status == "success"
        assert answer("seeing-too") == seen and "vision" in client.show("seeing-too").capabilities
        assert "Traceback" not in server.log()
    finally:
        assert server.stop() == 0, server.log()

    for lines, said in ((f"FROM {tiny['target']}\nFROM {tiny['partial']}", "a GGUF model, not a multimodal projector"),
                        (f"FROM {tiny['target']}\nFROM ./mmproj.gguf\nFROM ./mmproj.gguf", "a third FROM"),
                        (f"FROM {tiny['target']}\nFROM ./none.gguf", "FROM ./none.gguf: no such file"),
                        # (a second model named, as if it were a draft: said what a second FROM is)
                        (f"FROM {tiny['target']}\nFROM smollm2-135m", "it names a multimodal projector")):
        (folder / "Modelfile").write_text(lines + "\n")
        code, _, err = cli("create", "mine", "-f", folder / "Modelfile")
        assert code != 0 and said in err, err


def test_an_m_rope_image_holds_fewer_positions_than_rows_is_read_once_and_drafting_keeps_the_text(mmproj):
    def opened_qwen(mode=DrafterKind.PLAIN) -> Session:
        return Session(mmproj["qwen2vl_text"], None, Runtime(ctx_size=512, mmproj=str(mmproj["qwen2vl"])),
                       Speculation(drafting=mode))

    with opened_qwen() as session:
        tokens = session.prepare(Request(messages=[{"role": "user", "content": "look", "images": [RED]}])).tokens
        (start, end), = [(start, end) for start, end, image in media_runs(tokens) if image]
        rows = session.vision.rows(tokens[start:end])
        assert len(rows) > end - start and session.vision.extra_cells(tokens) == len(rows) - (end - start)
        plain, first = asked(session, RED, text="look")
        earlier = ({"role": "user", "content": "look", "images": [RED]}, {"role": "assistant", "content": "a cat"})
        _, second = asked(session, text="and now", earlier=earlier)
        assert second.reused_tokens > end and session.vision.encodings == 1  # cached, not read again
        two = asked(session, RED, BLUE, text=f"Assistant:{IMAGE_MARKER} and Assistant:{IMAGE_MARKER}")[0]
    with opened_qwen(DrafterKind.NGRAM) as session:
        assert asked(session, RED, text="look")[0] == plain
        assert asked(session, RED, BLUE, text=f"Assistant:{IMAGE_MARKER} and Assistant:{IMAGE_MARKER}")[0] == two


def test_the_images_kept_are_bounded_and_one_sent_again_keeps_its_ids(tiny, mmproj, monkeypatch):
    from localspec.engine import vision

    monkeypatch.setattr(vision, "KEPT_IMAGES", 2)
    with opened(tiny, mmproj) as session:
        ids = [session.vision.image_tokens(random_image(seed)) for seed in (1, 2, 3)]  # (a serve's images, ever more)
        assert not session.vision.holds(ids[0][0]) and all(session.vision.holds(i[0]) for i in ids[1:])
        assert session.vision.image_tokens(random_image(1)) == ids[0] and session.vision.holds(ids[0][-1])
        assert asked(session, random_image(1))[0]


def test_an_image_in_a_tools_result_is_read_and_a_model_without_a_projector_is_told_of_it(served, tiny):
    """Claude Code's Read of an image file and Codex's view_image answer with the image in the tool's result: a 400
    ("only text blocks are supported here"), and so every later request of that conversation, which carries it. A
    model with a projector reads it where it stands; one without reads a line saying an image is not shown."""
    import anthropic

    anthropics = anthropic.Anthropic(base_url=served.base, api_key="unused", max_retries=0)

    def read_by_claude_code(image: bytes) -> str:
        source = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(image).decode()}
        return anthropics.messages.create(model="tiny", max_tokens=16, extra_body={"temperature": 0}, messages=[
            {"role": "user", "content": "what is in red.png"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read",
                                               "input": {"file_path": "red.png"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                {"type": "text", "text": "red.png:"}, {"type": "image", "source": source}]}]}]).content[0].text

    def viewed_by_codex(image: bytes) -> str:
        return served.client().responses.create(model="tiny", max_output_tokens=16, temperature=0, input=[
            {"role": "user", "content": "what is in red.png"},
            {"type": "function_call", "call_id": "call_1", "name": "view_image", "arguments": '{"path": "red.png"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": [
                {"type": "input_image", "image_url": _data_url(image)}]}]).output_text

    assert read_by_claude_code(RED) != read_by_claude_code(BLUE)
    assert viewed_by_codex(RED) != viewed_by_codex(BLUE)
    with Session(tiny["target"], None, Runtime(ctx_size=512), Speculation()) as session:
        written = session.target_model.spell_of(session.prompts.chat_tokens([
            {"role": "user", "content": "what is in red.png"},
            {"role": "tool", "content": f"red.png:\n{IMAGE_MARKER}", "images": [RED]}])).decode()
    assert "red.png:\n[an image, not shown: this model reads no images]" in written
    assert "Traceback" not in served.log()
