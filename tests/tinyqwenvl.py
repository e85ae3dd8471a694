"""A tiny Qwen2-VL pair written with the gguf package, for tests of M-RoPE vision models on the pinned llama.cpp: a text
model of llama.cpp's architecture "qwen2vl" and its multimodal projector ("mmproj") of type "qwen2vl_merger"
(PROJECTOR_TYPE_QWEN2VL), as libllama and libmtmd read them.

The text model (src/models/qwen2vl.cpp): the llama tensors of tinymodels.py (Qwen2's q/k/v biases are optional and
left out), and the key qwen2vl.rope.dimension_sections (four int32, required: load_arch_hparams). Its rope type is
LLAMA_ROPE_TYPE_MROPE (llama_model_rope_type), so hparams.n_pos_per_embd() is 4: every position is (t, y, x, z),
section-major in a batch (pos[j * n_tokens + i]). ggml's M-RoPE rotates head-dimension pair k by section
(k % sum(sections)): the first ROPE_SECTIONS[0] pairs by t, the next [1] by y, the next [2] by x, the rest by z; as
Qwen2-VL's [16, 24, 24] for its 128-wide heads, the sections here fill the head's HEAD_DIM / 2 pairs. The tokenizer is
tinymodels' SPM one (LOWERCASE pieces) plus IMAGE_TEXT as control tokens: libmtmd writes "<|vision_start|>" before and
"<|vision_end|>" after each image (mtmd.cpp, PROJECTOR_TYPE_QWEN2VL) and tokenizes them with special tokens parsed,
so each is one token.

The projector (tools/mtmd/clip.cpp, models/qwen2vl.cpp): no learned positions and no patch bias (the graph asserts
none); the patch embedding is Qwen2-VL's temporal-2 Conv3D split into two Conv2Ds, v.patch_embd.weight and
v.patch_embd.weight.1, whose outputs a still image adds; VISION_LAYERS ViT blocks with layer norms (ln1, ln2, with
bias), q/k/v/out with biases, 2-D rotary positions (M-RoPE over d_head / 4 sections: the head size must be a multiple
of 4) and a gelu_quick MLP (neither clip.use_gelu nor use_silu, as Qwen2-VL's quick_gelu); v.post_ln (the merger's
ln_q); then 2 x 2 neighbouring patches concatenated (the graph hardcodes the merge of 2) and mm.2(gelu(mm.0(x))),
mm.0 being 4 * VISION_WIDTH square as in Qwen2-VL and mm.2's output width (clip_n_mmproj_embd: mm.2.bias's length)
the text model's n_embd. Keys as convert_hf_to_gguf's Qwen2VLVisionModel writes them (image_size is required though
unused for resizing).

Images keep their aspect ratio (mtmd_image_preprocessor_dyn_size): each side rounded to a multiple of
PATCH_SIZE * MERGE (ALIGN), then scaled up if under 8 image tokens or down if over 4096 (clip.cpp's
set_limit_image_tokens(8, 4096) for QWEN2VL; mtmd_context_params.image_min_tokens / image_max_tokens override them),
see image_grid. An image gives nx * ny rows (nx = width / ALIGN, ny = height / ALIGN), at decoder positions
(t, x, y) = (p0, p0 + col, p0 + row) for row-major row i = row * nx + col, and takes max(nx, ny) positions
(mtmd_image_tokens_get_n_pos): the text after it starts at p0 + max(nx, ny). image_png(seed) is an IMAGE_HEIGHT x
IMAGE_WIDTH PNG, which libmtmd keeps at that size: IMAGE_NX x IMAGE_NY = IMAGE_TOKENS rows, IMAGE_N_POS positions.
mtmd_decode_use_mrope is true (it follows the text model's rope type) and non-causal false. numpy shapes are ggml's
reversed."""

from pathlib import Path

import gguf
import numpy as np
from tinymodels import N_EMBD, N_HEAD, TinySpec, add_spm_tokenizer, attention_writer, finish, tiny_weights
from tinyvision import VISION_WIDTH, clip_writer, drawing, random_image, vision_blocks

HEAD_DIM = N_EMBD // N_HEAD  # 16
ROPE_SECTIONS = (2, 3, 3, 0)  # t, y, x, z rotation pairs: HEAD_DIM / 2 in all
IMAGE_TEXT = ("<|vision_start|>", "<|vision_end|>")  # the text libmtmd writes before and after each image
TEXT_SPEC = TinySpec(seed=1, control=IMAGE_TEXT)  # the vocabulary (and its layout) of write_tiny_qwen2vl
N_VOCAB = len(TEXT_SPEC.vocab)  # 3 + 256 bytes + 29 pieces + 2 = 290
VISION_START_ID = N_VOCAB - 2  # the ids of IMAGE_TEXT's two tokens
VISION_END_ID = N_VOCAB - 1

PATCH_SIZE = 4
MERGE = 2  # spatial merge: 2 x 2 patches make one image row
ALIGN = PATCH_SIZE * MERGE  # 8: an image's sides are resized to multiples of it
MIN_IMAGE_TOKENS, MAX_IMAGE_TOKENS = 8, 4096  # clip.cpp's limits for QWEN2VL
IMAGE_WIDTH, IMAGE_HEIGHT = 32, 24  # image_png's size, which libmtmd keeps
IMAGE_NX, IMAGE_NY = IMAGE_WIDTH // ALIGN, IMAGE_HEIGHT // ALIGN  # 4 x 3 image rows
IMAGE_TOKENS = IMAGE_NX * IMAGE_NY  # 12: embeddings (n_tokens) of image_png's chunk
IMAGE_N_POS = max(IMAGE_NX, IMAGE_NY)  # 4: the positions its chunk takes (n_pos)
VISION_HEADS = 2  # d_head 16 (tinyvision's VISION_WIDTH 32), a multiple of 4: the vision M-RoPE's four sections
MERGER_HIDDEN = 4 * VISION_WIDTH  # mm.0's width, as Qwen2-VL's merger
IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)  # Qwen2-VL's (OpenAI CLIP's)
IMAGE_STD = (0.26862954, 0.26130258, 0.27577711)


def write_tiny_qwen2vl(path: Path, seed: int = 1, sharpness: float = 2.0, writes_pieces: bool = False) -> Path:
    """The text model: N_LAYER llama-like layers, N_EMBD wide, N_HEAD heads, vocabulary TEXT_SPEC's (N_VOCAB).
    writes_pieces: TinySpec's (byte tokens' logits pinned at 0 too, so that greedy text is pieces)."""
    spec = TinySpec(seed=seed, sharpness=sharpness, control=IMAGE_TEXT, writes_pieces=writes_pieces)
    tensors = tiny_weights(spec)
    tensors["output.weight"][[VISION_START_ID, VISION_END_ID]] = 0.0  # as <s> and </s>: rarely the greedy choice
    writer = attention_writer(path, "qwen2vl", 1e-6)  # (its rope dimensions the head size, as qwen2vl's graph asserts)
    writer.add_rope_dimension_sections(list(ROPE_SECTIONS))
    writer.add_rope_freq_base(10000.0)
    add_spm_tokenizer(writer, spec.pieces, control=IMAGE_TEXT)
    return finish(writer, tensors, path)


def write_tiny_qwen2vl_mmproj(path: Path, seed: int = 7, width: int = N_EMBD) -> Path:
    """width: the projector's output width, which must be the text model's n_embd for libmtmd to accept the pair."""
    rng = np.random.default_rng(seed)
    normal, small = drawing(rng)

    # the two temporal halves of the Conv3D: each reads the whole (still) image, their sum about 1
    scale = np.sqrt(0.5)
    tensors = {
        "v.patch_embd.weight": normal(VISION_WIDTH, 3, PATCH_SIZE, PATCH_SIZE, scale=scale),
        "v.patch_embd.weight.1": normal(VISION_WIDTH, 3, PATCH_SIZE, PATCH_SIZE, scale=scale),
    }
    tensors |= vision_blocks(normal, small)
    tensors["v.post_ln.weight"] = np.ones(VISION_WIDTH, dtype=np.float32)
    tensors["v.post_ln.bias"] = np.zeros(VISION_WIDTH, dtype=np.float32)
    # the merger reads 4 layer-normed patches: mm.2's outputs about 1, as the text model's token embeddings
    tensors["mm.0.weight"] = normal(MERGER_HIDDEN, 4 * VISION_WIDTH)
    tensors["mm.0.bias"] = small(MERGER_HIDDEN)
    tensors["mm.2.weight"] = normal(width, MERGER_HIDDEN, scale=2.0)
    tensors["mm.2.bias"] = small(width)

    writer = clip_writer(path, gguf.VisionProjectorType.QWEN2VL, IMAGE_WIDTH, PATCH_SIZE, width,  # ("qwen2vl_merger")
                         heads=VISION_HEADS, epsilon=1e-6, mean=IMAGE_MEAN, std=IMAGE_STD)
    writer.add_uint32("clip.vision.spatial_merge_size", MERGE)
    return finish(writer, tensors, path)


def image_grid(height: int, width: int, min_tokens: int = MIN_IMAGE_TOKENS,
               max_tokens: int = MAX_IMAGE_TOKENS) -> tuple[int, int]:
    """(nx, ny): the image rows across and down libmtmd makes of a height x width image (nx * ny of them, taking
    max(nx, ny) positions), as mtmd-image.cpp's calc_size_preserved_ratio sizes it (in float32 there)."""
    f = ALIGN
    min_pixels, max_pixels = min_tokens * f * f, max_tokens * f * f
    w_bar = max(f, int(np.floor(np.float32(width) / f + 0.5)) * f)  # std::round: halves away from zero
    h_bar = max(f, int(np.floor(np.float32(height) / f + 0.5)) * f)
    if h_bar * w_bar > max_pixels:
        beta = np.sqrt(np.float32(height) * width / max_pixels, dtype=np.float32)
        h_bar = max(f, int(np.floor(np.float32(height / beta) / f)) * f)
        w_bar = max(f, int(np.floor(np.float32(width / beta) / f)) * f)
    elif h_bar * w_bar < min_pixels:
        beta = np.sqrt(np.float32(min_pixels) / (np.float32(height) * width), dtype=np.float32)
        h_bar = int(np.ceil(np.float32(height * beta) / f)) * f
        w_bar = int(np.ceil(np.float32(width * beta) / f)) * f
    return w_bar // f, h_bar // f


def image_png(seed: int, height: int = IMAGE_HEIGHT, width: int = IMAGE_WIDTH) -> bytes:
    """A PNG of random pixels, one per seed; at the default size libmtmd does not resize it (IMAGE_TOKENS rows)."""
    return random_image(seed, height=height, width=width)
