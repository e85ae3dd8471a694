"""A tiny Qwen2-Audio pair written with the gguf package, for tests of audio input on the pinned llama.cpp: a llama
text model whose vocabulary has Qwen2-Audio's <|audio_bos|> and <|audio_eos|> as control tokens, and a multimodal
projector of type "qwen2a" (PROJECTOR_TYPE_QWEN2A) with a Whisper encoder, as libmtmd reads them.

What tools/mtmd/clip.cpp reads (load_hparams with the audio modality; load_tensors with the prefix "a"):
clip.has_audio_encoder, clip.projector_type, clip.audio.{embedding_length, feed_forward_length, block_count,
attention.head_count, projection_dim, attention.layer_norm_epsilon, num_mel_bins}; a.conv1d.1 and a.conv1d.2 (weight
and bias: the biases [1, width] in ggml, as convert_hf_to_gguf unsqueezes them; the weights F16, as it forces them),
a.position_embd.weight (at least 1500 positions: the graph views that many), the ViT blocks a.blk.N with attn_k
without a bias (models/whisper-enc.cpp asserts none), a.post_ln, and mm.a.fc (weight, bias) whose output width
(clip_n_mmproj_embd) must be the text model's n_embd. The graph: the two convolutions (the second of stride 2),
gelu, the learned positions, the blocks, an average pool of 2 (audio_has_avgpool), post_ln, then mm.a.fc.

libmtmd decodes the file (miniaudio: WAV, MP3, FLAC) to 16 kHz mono, takes its log-mel spectrogram (Whisper's:
n_fft 400, hop 160) with 30 seconds of silence after it, and cuts it into 3000-frame chunks, the last incomplete one
dropped: audio up to 30 seconds is one chunk, AUDIO_ROWS rows at one position each (causal, no M-RoPE), between the
text <|audio_bos|> and <|audio_eos|>. The text model's context must hold them: it is written for CONTEXT tokens.
numpy shapes are ggml's reversed."""

import io
import wave
from pathlib import Path

import gguf
import numpy as np
from tinymodels import N_EMBD, TinySpec, add_spm_tokenizer, attention_writer, finish, tiny_weights
from tinyvision import drawing, vision_blocks

AUDIO_TEXT = ("<|audio_bos|>", "<|audio_eos|>")  # the text libmtmd writes before and after each audio file
TEXT_SPEC = TinySpec(seed=1, sharpness=2.0, control=AUDIO_TEXT)
CONTEXT = 2048
AUDIO_WIDTH = 32
AUDIO_HEADS = 4
AUDIO_FF = 64
AUDIO_LAYERS = 1
MEL_BINS = 80
AUDIO_POSITIONS = 1500  # a chunk's 3000 frames after the stride-2 convolution
AUDIO_ROWS = AUDIO_POSITIONS // 2  # after the average pool: the rows (and positions) of up to 30 seconds
SAMPLE_RATE = 16000


def write_tiny_audio_text(path: Path) -> Path:
    writer = attention_writer(path, context=CONTEXT)
    add_spm_tokenizer(writer, TEXT_SPEC.pieces, control=AUDIO_TEXT)
    return finish(writer, tiny_weights(TEXT_SPEC), path)


def write_tiny_qwen2a_mmproj(path: Path, seed: int = 11, width: int = N_EMBD) -> Path:
    rng = np.random.default_rng(seed)
    normal, small = drawing(rng)
    tensors = {
        "a.conv1d.1.weight": normal(AUDIO_WIDTH, MEL_BINS, 3).astype(np.float16),
        "a.conv1d.1.bias": small(AUDIO_WIDTH).reshape(AUDIO_WIDTH, 1),
        "a.conv1d.2.weight": normal(AUDIO_WIDTH, AUDIO_WIDTH, 3).astype(np.float16),
        "a.conv1d.2.bias": small(AUDIO_WIDTH).reshape(AUDIO_WIDTH, 1),
        "a.position_embd.weight": (rng.standard_normal((AUDIO_POSITIONS, AUDIO_WIDTH)) * 0.1).astype(np.float32),
    }
    for name, weights in vision_blocks(normal, small, AUDIO_WIDTH, AUDIO_FF, AUDIO_LAYERS).items():
        if not name.endswith("attn_k.bias"):  # (Whisper's keys have no bias)
            tensors["a." + name.removeprefix("v.")] = weights
    tensors["a.post_ln.weight"] = np.ones(AUDIO_WIDTH, dtype=np.float32)
    tensors["a.post_ln.bias"] = np.zeros(AUDIO_WIDTH, dtype=np.float32)
    tensors["mm.a.fc.weight"] = normal(width, AUDIO_WIDTH, scale=2.0)
    tensors["mm.a.fc.bias"] = small(width)

    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_name(path.stem)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_bool("clip.has_audio_encoder", True)
    writer.add_string("clip.projector_type", "qwen2a")
    writer.add_uint32("clip.audio.embedding_length", AUDIO_WIDTH)
    writer.add_uint32("clip.audio.feed_forward_length", AUDIO_FF)
    writer.add_uint32("clip.audio.block_count", AUDIO_LAYERS)
    writer.add_uint32("clip.audio.attention.head_count", AUDIO_HEADS)
    writer.add_uint32("clip.audio.projection_dim", width)
    writer.add_float32("clip.audio.attention.layer_norm_epsilon", 1e-5)
    writer.add_uint32("clip.audio.num_mel_bins", MEL_BINS)
    return finish(writer, tensors, path)


def wav(seed: int, seconds: float = 1.0) -> bytes:
    """A WAV file (16 kHz mono, 16-bit) of a few random tones, one per seed."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(SAMPLE_RATE * seconds)) / SAMPLE_RATE
    signal = sum(np.sin(2 * np.pi * rng.uniform(100, 3000) * t + rng.uniform(0, 6)) for _ in range(3)) / 3
    out = io.BytesIO()
    with wave.open(out, "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(2)
        file.setframerate(SAMPLE_RATE)
        file.writeframes((signal * 20000).astype("<i2").tobytes())
    return out.getvalue()
