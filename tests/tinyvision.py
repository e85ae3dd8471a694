"""A tiny multimodal projector ("mmproj") written with the gguf package, for the tiny llama-architecture models of
tinymodels.py: a CLIP vision encoder with LLaVA's "mlp" projector, as the pinned llama.cpp's libmtmd reads one.

What tools/mtmd/clip.cpp reads: in clip_model_loader's constructor clip.has_vision_encoder; in load_hparams
clip.projector_type ("mlp", PROJECTOR_TYPE_NAMES in clip-impl.h), clip.vision.{embedding_length, attention.head_count,
feed_forward_length, block_count, projection_dim, attention.layer_norm_epsilon, image_size, patch_size} (uint32 but
the epsilon, all required) and clip.vision.image_mean / image_std (three float32 each, else it throws); in
load_tensors v.patch_embd.weight (+ .bias), v.position_embd.weight, v.pre_ln.*, per block v.blk.N.{attn_q, attn_k,
attn_v, attn_out, ln1, ln2, ffn_up, ffn_down}.{weight,bias} (attn_out, ffn_up, ffn_down required at load; the
position embedding and attn_q/k/v optional there but used by the graph; ffn_down's ggml ne[0] must differ from the
vision width, else it takes up and down as swapped), and the projector mm.0 and mm.2 (weight, bias). The graph is
models/llava.cpp: patch convolution, learned positions, the blocks up to the second-to-last (so with VISION_LAYERS = 2
one block runs), then mm.2(gelu(mm.0(x))). mtmd.cpp checks that mm.2's output width (clip_n_mmproj_embd) equals the
text model's n_embd, and preprocesses any image with mtmd_image_preprocessor_fixed_size: resized to IMAGE_SIZE
square, one token per patch, no extra begin/end tokens, one position per token (no M-RoPE, causal).

projector="gemma3" writes Gemma 3's instead (PROJECTOR_TYPE_GEMMA3): the same kind of ViT, built by
models/siglip.cpp with every block (no feature-layer skipping), learned positions, v.post_ln (no v.pre_ln) and gelu
(clip.use_gelu, as convert_hf_to_gguf writes it); then an n_merge x n_merge average pool over the square patch grid
(n_merge from clip.vision.projector.scale_factor, 4 if absent; the grid's side must be a multiple of it), an RMS norm
times mm.soft_emb_norm.weight (vision width) and mm.input_projection.weight (ggml [text n_embd, vision width], whose
ne[0] clip_n_mmproj_embd reports). Images are resized (bilinear) to GEMMA3_IMAGE_SIZE square and give
GEMMA3_IMAGE_TOKENS rows, one position each (no M-RoPE). mtmd.cpp wraps each image in the text "<start_of_image>" and
"<end_of_image>", tokenized (special tokens parsed) by the text model's tokenizer: single tokens only where its
vocabulary has them (TinySpec(user_defined=GEMMA3_IMAGE_TEXT) gives that), else bytes and pieces. And
mtmd_decode_use_non_causal is true for its image chunks: mtmd_helper_eval_chunks decodes their rows with
llama_set_causal_attn(false) (in n_batch pieces, so a batch smaller than GEMMA3_IMAGE_TOKENS splits the image).
numpy shapes are ggml's reversed."""

import struct
import zlib
from pathlib import Path

import gguf
import numpy as np
from tinymodels import N_EMBD, finish

IMAGE_SIZE = 32  # the side every image is resized to
PATCH_SIZE = 8
IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2  # embeddings (and positions) one image takes in the text model: 16
VISION_WIDTH = 32
VISION_HEADS = 4
VISION_FF = 64
VISION_LAYERS = 2
PROJECTOR_HIDDEN = 64
IMAGE_MEAN = (0.5, 0.5, 0.5)
IMAGE_STD = (0.5, 0.5, 0.5)
# projector="gemma3": a 6 x 6 patch grid, pooled 2 x 2 into 3 x 3 image rows
GEMMA3_IMAGE_SIZE = 24
GEMMA3_PATCH_SIZE = 4
GEMMA3_MERGE = 2  # clip.vision.projector.scale_factor: the average pool's kernel and stride
GEMMA3_PATCHES = (GEMMA3_IMAGE_SIZE // GEMMA3_PATCH_SIZE) ** 2  # 36, the ViT's sequence (and position embeddings)
GEMMA3_IMAGE_TOKENS = GEMMA3_PATCHES // GEMMA3_MERGE ** 2  # embeddings (and positions) one image takes: 9
GEMMA3_IMAGE_TEXT = ("<start_of_image>", "<end_of_image>")  # the text libmtmd writes before and after each image
PROJECTORS = ("mlp", "gemma3")


def write_tiny_mmproj(path: Path, seed: int = 7, width: int = N_EMBD, projector: str = "mlp") -> Path:
    """width: the projector's output width, which must be the text model's n_embd for libmtmd to accept the pair.
    projector: "mlp" (LLaVA's, causal, IMAGE_TOKENS rows an image) or "gemma3" (Gemma 3's, non-causal,
    GEMMA3_IMAGE_TOKENS rows an image, wrapped in GEMMA3_IMAGE_TEXT)."""
    if projector not in PROJECTORS:
        raise ValueError(f"unknown projector {projector!r}, not one of {PROJECTORS}")
    gemma3 = projector == "gemma3"
    patch_size = GEMMA3_PATCH_SIZE if gemma3 else PATCH_SIZE
    n_patches = GEMMA3_PATCHES if gemma3 else IMAGE_TOKENS
    rng = np.random.default_rng(seed)
    normal, small = drawing(rng)
    tensors = {
        "v.patch_embd.weight": normal(VISION_WIDTH, 3, patch_size, patch_size),
        "v.patch_embd.bias": small(VISION_WIDTH),
        "v.position_embd.weight": (rng.standard_normal((n_patches, VISION_WIDTH)) * 0.1).astype(np.float32),
    }
    if not gemma3:  # (SigLIP, Gemma 3's ViT, has no pre-norm but a post-norm)
        tensors["v.pre_ln.weight"] = np.ones(VISION_WIDTH, dtype=np.float32)
        tensors["v.pre_ln.bias"] = np.zeros(VISION_WIDTH, dtype=np.float32)
    tensors |= vision_blocks(normal, small)
    if gemma3:
        tensors["v.post_ln.weight"] = np.ones(VISION_WIDTH, dtype=np.float32)
        tensors["v.post_ln.bias"] = np.zeros(VISION_WIDTH, dtype=np.float32)
        # the RMS norm's weight as the converter stores it (Gemma's 1 + w already added)
        tensors["mm.soft_emb_norm.weight"] = np.ones(VISION_WIDTH, dtype=np.float32)
        # numpy (vision width, text width), ggml [width, VISION_WIDTH]: the graph multiplies by its transpose. Its
        # input is RMS-normed, so each output is about 1, as the text model's token embeddings are.
        tensors["mm.input_projection.weight"] = (
            rng.standard_normal((VISION_WIDTH, width)) / np.sqrt(VISION_WIDTH)).astype(np.float32)
    else:
        tensors["mm.0.weight"] = normal(PROJECTOR_HIDDEN, VISION_WIDTH)
        tensors["mm.0.bias"] = small(PROJECTOR_HIDDEN)
        tensors["mm.2.weight"] = normal(width, PROJECTOR_HIDDEN, scale=2.0)
        tensors["mm.2.bias"] = small(width)

    writer = clip_writer(path, projector, GEMMA3_IMAGE_SIZE if gemma3 else IMAGE_SIZE, patch_size, width)
    if gemma3:
        writer.add_bool("clip.use_gelu", True)
        writer.add_uint32("clip.vision.projector.scale_factor", GEMMA3_MERGE)
    return finish(writer, tensors, path)


def drawing(rng: np.random.Generator):
    """(normal, small): seeded weights, normal(*shape, scale) scaled by 1/sqrt(fan in) so that each output is about
    `scale`, small(n) biases near 0."""
    def normal(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    def small(n):
        return (rng.standard_normal(n) * 0.02).astype(np.float32)

    return normal, small


def vision_blocks(normal, small, heads_width: int = VISION_WIDTH, ff: int = VISION_FF,
                  layers: int = VISION_LAYERS) -> dict[str, np.ndarray]:
    """A ViT's blocks as clip.cpp names them (attention with biases, two layer norms, a feed-forward), drawn in
    this order with drawing()'s normal and small."""
    tensors = {}
    for layer in range(layers):
        block = f"v.blk.{layer}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensors[f"{block}.{name}.weight"] = normal(heads_width, heads_width)
            tensors[f"{block}.{name}.bias"] = small(heads_width)
        for name in ("ln1", "ln2"):
            tensors[f"{block}.{name}.weight"] = np.ones(heads_width, dtype=np.float32)
            tensors[f"{block}.{name}.bias"] = np.zeros(heads_width, dtype=np.float32)
        tensors[f"{block}.ffn_up.weight"] = normal(ff, heads_width)
        tensors[f"{block}.ffn_up.bias"] = small(ff)
        tensors[f"{block}.ffn_down.weight"] = normal(heads_width, ff)
        tensors[f"{block}.ffn_down.bias"] = small(heads_width)
    return tensors


def clip_writer(path: Path, projector: str, image_size: int, patch_size: int, width: int, heads: int = VISION_HEADS,
                epsilon: float = 1e-5, mean=IMAGE_MEAN, std=IMAGE_STD) -> gguf.GGUFWriter:
    """A projector's writer with the keys every clip.cpp projector reads (width: its output's, the text model's
    n_embd); the caller adds its own keys and tensors and finishes it."""
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_name(path.stem)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_string("clip.projector_type", projector)
    writer.add_uint32("clip.vision.image_size", image_size)
    writer.add_uint32("clip.vision.patch_size", patch_size)
    writer.add_uint32("clip.vision.embedding_length", VISION_WIDTH)
    writer.add_uint32("clip.vision.feed_forward_length", VISION_FF)
    writer.add_uint32("clip.vision.block_count", VISION_LAYERS)
    writer.add_uint32("clip.vision.attention.head_count", heads)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", epsilon)
    writer.add_uint32("clip.vision.projection_dim", width)
    writer.add_array("clip.vision.image_mean", [float(v) for v in mean])
    writer.add_array("clip.vision.image_std", [float(v) for v in std])
    return writer


def png(pixels: np.ndarray) -> bytes:
    """An RGB image (height x width x 3, uint8) as a PNG file's bytes, written by hand (no imaging library here)."""
    height, width, _ = pixels.shape

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + pixels[row].tobytes() for row in range(height))  # (filter 0 on every row)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def random_image(seed: int, height: int = 20, width: int = 24) -> bytes:
    """A PNG of random pixels (not the projector's size: libmtmd resizes it), one per seed."""
    return png(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))
