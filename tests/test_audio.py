"""Audio read through a projector with an audio encoder (Qwen2-Audio's "qwen2a", a Whisper encoder), as llama.cpp's
libmtmd reads it: checked against libmtmd's own helpers, kept lossless by every drafter, and taken by run's --audio,
a path in a prompt, chat's /audio and OpenAI's input_audio parts."""

import base64

import httpx2 as httpx
import numpy as np
import pytest

from localspec.chat_template import render
from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation
from localspec.engine.vision import media_runs
from localspec.errors import InputError, UsageError
from localspec.events import Token
from localspec.prompts import MEDIA_MARKER
from localspec.request import IMAGE_MARKER, Request
from localspec.session import Session

from test_vision import libmtmd_greedy
from tinyaudio import AUDIO_ROWS, AUDIO_TEXT, CONTEXT, wav, write_tiny_audio_text, write_tiny_qwen2a_mmproj
from tinymodels import TinySpec, write_tiny_model
from tinyvision import random_image, write_tiny_mmproj

HUM, BUZZ = wav(1), wav(2)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("audio")
    return {"text": write_tiny_audio_text(folder / "qwen2-audio-text.gguf"),
            "mmproj": write_tiny_qwen2a_mmproj(folder / "mmproj-qwen2-audio.gguf"),
            # a draft model of the same vocabulary, and a projector that sees but does not hear
            "draft": write_tiny_model(folder / "draft.gguf", TinySpec(seed=2, sharpness=2.0, control=AUDIO_TEXT)),
            "eyes": write_tiny_mmproj(folder / "mmproj-vision.gguf")}


def opened(pair, draft: bool = False, mode=DrafterKind.PLAIN, projector: str = "mmproj") -> Session:
    return Session(pair["text"], pair["draft"] if draft else None, Runtime(ctx_size=CONTEXT, mmproj=str(pair[projector])),
                   Speculation(drafting=mode))


def heard(session: Session, *sounds: bytes, text: str = "what is it", n: int = 16) -> list[int]:
    messages = [{"role": "user", "content": text, "images": list(sounds)}]
    return [e.id for e in session.generate(Request(Sampling(temperature=0), Limits(n), messages=messages))
            if isinstance(e, Token)]


def test_the_prompt_and_its_answer_are_those_llama_cpps_own_multimodal_helpers_make(pair):
    """libmtmd's path (mtmd_tokenize, mtmd_helper_eval_chunks): the same tokens around the audio (<|audio_bos|> and
    <|audio_eos|>), its AUDIO_ROWS rows at a position each, the same greedy answer and log probabilities."""
    with opened(pair) as session:
        listen = [{"role": "user", "content": "listen", "images": [HUM]}]
        tokens = session.prepare(Request(messages=listen)).tokens
        events = session.generate(Request(Sampling(temperature=0, logprobs=0), Limits(10), messages=listen))
        answer, logprobs = zip(*[(e.id, e.logprobs.chosen.logprob) for e in events if isinstance(e, Token)])
        text = render(session.prompts.template, [{"role": "user", "content": MEDIA_MARKER + "listen"}], "", "")
        assert session.info.audio and not session.info.vision
    layout, reference, their_logprobs = libmtmd_greedy(pair["text"], pair["mmproj"], text, HUM, 10, n_ctx=CONTEXT,
                                                       last_alone=True)
    ours = [("audio", end - start) if media else tokens[start:end] for start, end, media in media_runs(tokens)]
    assert [("audio", AUDIO_ROWS)] == [part for part in layout if isinstance(part, tuple)]
    assert layout == ours
    assert list(answer) == reference and np.allclose(logprobs, their_logprobs, atol=1e-3), (logprobs, their_logprobs)


def test_audio_over_30_seconds_is_chunks_read_one_after_another_as_libmtmd_reads_them(pair):
    """libmtmd cuts 31 seconds into two chunks of rows (its last second, an incomplete chunk, dropped): their ids run
    on, both are encoded, and the answer is libmtmd's (before, each chunk's ids began again at 0 and only the first
    chunk was encoded)."""
    long = wav(3, seconds=31)
    with opened(pair) as session:
        listen = [{"role": "user", "content": "listen", "images": [long]}]
        tokens = session.prepare(Request(messages=listen)).tokens
        assert len(set(t for t in tokens if t < 0)) == 2 * AUDIO_ROWS
        events = session.generate(Request(Sampling(temperature=0, logprobs=0), Limits(6), messages=listen))
        answer, logprobs = zip(*[(e.id, e.logprobs.chosen.logprob) for e in events if isinstance(e, Token)])
        text = render(session.prompts.template, [{"role": "user", "content": MEDIA_MARKER + "listen"}], "", "")
    # (read in the session's batches: 1,500 rows summed in other groupings part by up to 2e-3)
    layout, reference, their_logprobs = libmtmd_greedy(pair["text"], pair["mmproj"], text, long, 6, n_ctx=CONTEXT,
                                                       n_batch=Runtime().prompt_batch, last_alone=True)
    assert [part for part in layout if isinstance(part, tuple)] == [("audio", AUDIO_ROWS)] * 2
    assert list(answer) == reference and np.allclose(logprobs, their_logprobs, atol=1e-3), (logprobs, their_logprobs)


def test_audio_is_read_and_every_drafter_keeps_the_targets_text(pair):
    with opened(pair) as session:
        hum = heard(session, HUM)
        assert hum != heard(session, BUZZ) != heard(session)
        assert session.vision.encodings == 2
        assert heard(session, HUM) == hum  # (its rows kept: not encoded again)
        assert session.vision.encodings == 2
    for draft, mode in ((False, DrafterKind.NGRAM), (True, DrafterKind.DRAFT), (True, DrafterKind.AUTO)):
        with opened(pair, draft, mode) as session:
            assert heard(session, HUM) == hum, (draft, mode)


def test_audio_where_the_projector_only_sees_and_images_where_it_only_hears_are_refused(pair, tiny):
    with opened(pair) as session:
        with pytest.raises(InputError, match=r"image 1 is an image, which mmproj-qwen2-audio.gguf does not read \(it"
                                             r" reads audio"):
            heard(session, random_image(1))
        with pytest.raises(InputError, match="audio 1 is not audio llama.cpp decodes"):
            heard(session, b"RIFF\x00\x00\x00\x00WAVEjunk and more junk")
    with Session(tiny["target"], None, Runtime(ctx_size=512, mmproj=str(pair["eyes"])),
                 Speculation(drafting=DrafterKind.PLAIN)) as session:
        with pytest.raises(InputError, match=r"audio 1 is audio, which mmproj-vision.gguf does not read \(it reads"
                                             r" images"):
            heard(session, HUM)
    with Session(tiny["target"], None, Runtime(ctx_size=512), Speculation(drafting=DrafterKind.PLAIN)) as session:
        with pytest.raises(UsageError, match=r"this model reads no audio: load it with its multimodal projector"):
            heard(session, HUM)


def test_run_and_chat_read_audio_by_option_command_or_path(cli, pair, tmp_path):
    sound = tmp_path / "hum.wav"
    sound.write_bytes(HUM)
    loaded = ("--mmproj", pair["mmproj"], "-n", "12", "--temp", "0", "--no-draft", "-c", str(CONTEXT))

    def run(*args) -> str:
        code, out, err = cli("run", pair["text"], *loaded, "-q", *args)
        assert code == 0, err
        return out

    by_option = run("--audio", sound, "-p", "what is it")
    assert by_option == run("--image", sound, "-p", "what is it") == run("-p", f"what is it {sound}")
    assert by_option != run("-p", "what is it")
    code, out, err = cli("chat", pair["text"], *loaded, stdin=f"/audio {sound}\nwhat is it\n".encode())
    assert code == 0 and out.startswith("audio ") and by_option.splitlines()[0] in out.splitlines(), err
    code, out, _ = cli("chat", pair["text"], *loaded, stdin=f"/image {sound}\nhi\n".encode())
    assert code == 0 and "this model reads no images" in out


def test_serve_reads_openais_input_audio_parts(tmp_path, pair):
    from test_server import ServerProcess

    with opened(pair) as session:
        expected = session.chat(sampling=Sampling(temperature=0), limits=Limits(16)).send("what is it", [HUM]).text
    server = ServerProcess(tmp_path / "home", pair["text"], "--alias", "hears", "-c", str(CONTEXT), "--mmproj",
                           pair["mmproj"], "--no-draft")
    try:
        client = server.client()

        def asked(audio: dict) -> str:
            return client.chat.completions.create(model="hears", max_tokens=16, temperature=0, messages=[
                {"role": "user", "content": [{"type": "input_audio", "input_audio": audio},
                                             {"type": "text", "text": "what is it"}]}]).choices[0].message.content

        hum = asked({"data": base64.b64encode(HUM).decode(), "format": "wav"})
        assert hum == expected != asked({"data": base64.b64encode(BUZZ).decode(), "format": "wav"})
        # OpenAI's speech to text, as llama-server answers it: the file asked of the model as a chat
        with opened(pair) as session:
            transcribed = session.chat(sampling=Sampling(temperature=0), limits=Limits(16)).send(
                f"Transcribe audio to text (language: en)\n{IMAGE_MARKER}", [HUM]).text
            template = session.prompts.template  # (read while it is open: a closed session's use is refused)
        sound = tmp_path / "hum.wav"
        sound.write_bytes(HUM)
        with open(sound, "rb") as file:
            transcript = client.audio.transcriptions.create(model="whisper-1", file=file, language="en",
                                                            extra_body={"max_tokens": 16, "temperature": 0})
        assert transcript.text == transcribed and transcript.usage.input_tokens > AUDIO_ROWS
        with open(sound, "rb") as file:
            events = list(client.audio.transcriptions.create(model="whisper-1", file=file, language="en", stream=True,
                                                             extra_body={"max_tokens": 16, "temperature": 0}))
        assert "".join(e.delta for e in events if e.type == "transcript.text.delta") == transcribed
        assert events[-1].type == "transcript.text.done" and events[-1].text == transcribed
        with open(sound, "rb") as file:
            refused = httpx.post(server.url + "/audio/transcriptions", timeout=60, files={"file": file},
                                 data={"response_format": "srt"})
        assert refused.status_code == 400 and "only json" in refused.json()["error"]["message"], refused.text
        # llama-server's /completion: an audio file's base64 in multimodal_data, where the prompt writes the marker
        prompt = render(template, [{"role": "user", "content": f"{MEDIA_MARKER}\nwhat is it"}], "", "")
        completed = httpx.post(server.base + "/completion", timeout=60, json={
            "prompt": {"prompt_string": prompt, "multimodal_data": [base64.b64encode(HUM).decode()]}, "n_predict": 16,
            "temperature": 0})
        assert completed.status_code == 200 and completed.json()["content"] == hum, completed.text
        props = httpx.get(server.base + "/props", timeout=30).json()
        assert props["modalities"] == {"vision": False, "audio": True}
        assert httpx.get(server.base + "/localspec/v1/info", timeout=30).json()["audio"] is True
        for audio, said in [({"data": base64.b64encode(HUM).decode(), "format": "ogg"}, "input_audio.format: one of"),
                            ({"data": "data:audio/wav;base64,AAAA", "format": "wav"}, "not a URL"),
                            ({"data": "@@@", "format": "wav"}, "input_audio.data: not base64 text"),
                            ({"data": base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(16)).decode(), "format": "wav"},
                             "input_audio.data: no WAV, MP3 or FLAC file")]:
            refused = httpx.post(server.url + "/chat/completions", timeout=60, json={"model": "hears", "messages": [
                {"role": "user", "content": [{"type": "input_audio", "input_audio": audio}]}]})
            assert refused.status_code == 400 and said in refused.json()["error"]["message"], refused.text
        assert "Traceback" not in server.log()
    finally:
        assert server.stop() == 0, server.log()


def test_a_transcription_is_asked_as_llama_server_asks_it():
    """The form as llama-server's chat: "Transcribe audio to text" (or the form's prompt), the language after it, the
    audio; LFM2's templates (its tool list's markers) get its system prompt "Perform ASR." and no words of the user's."""
    from localspec.protocols.openai import transcription_chat

    asked = transcription_chat({"language": "fr", "max_tokens": "8", "stream": "true"}, HUM, "{{ messages }}")
    [message] = asked["messages"]
    assert message["content"][0] == {"type": "text", "text": "Transcribe audio to text (language: fr)"}
    assert base64.b64decode(message["content"][1]["input_audio"]["data"]) == HUM
    assert asked["max_tokens"] == 8 and asked["stream"] is True
    lfm2 = transcription_chat({}, HUM, "<|tool_list_start|>{{ tools }}<|tool_list_end|>")["messages"]
    assert lfm2[0] == {"role": "system", "content": "Perform ASR."} and len(lfm2[1]["content"]) == 1
