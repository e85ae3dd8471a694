"""Images read by the target through its multimodal projector (llama.cpp's libmtmd, `--mmproj`).

A prompt's tokens hold an image as a run of ids below 0, which no vocabulary reaches: one block of ids an image,
one id a position it takes, so that the token bookkeeping every cache does (a chat's earlier turns, a sequence's
reuse, the drafters' histories, positions as indices) holds images too, and the same image in the same place reads
as the same tokens. The target's context decodes such a run as the projector's embedding rows (Context.media):
a row a position, or, where the model places rows by M-RoPE (Qwen2-VL's family), all of the image's rows at the
positions libmtmd gives them, in fewer positions than rows. Any other context (a draft model's, which never saw
the image) reads a stand-in token at each position, as llama.cpp's speculative drafting reads zero rows there. An
image is encoded only when its rows are decoded: a turn that finds it cached costs no encoding.
"""

import ctypes
import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..errors import InputError, ModelLoadError, UsageError
from .library import _log, llama, recent_errors
from .model import Model, check_is_gguf

# the ids of one image's positions: -(1 + image * ROWS_PER_IMAGE + position); the largest images take a few thousand
ROWS_PER_IMAGE = 1 << 14
IMAGES = (1 << 31) // ROWS_PER_IMAGE - 1  # images one process can name before its ids would leave int32
KEPT_ENCODED = 8  # images whose embedding rows are kept (a chat's reads its image once, then finds it cached)
KEPT_IMAGES = 256  # images whose files are kept, to encode again where a cache let their rows go


def is_media(token: int) -> bool:
    return token < 0


def image_of(token: int) -> int:
    return (-token - 1) // ROWS_PER_IMAGE


def row_of(token: int) -> int:
    return (-token - 1) % ROWS_PER_IMAGE


def media_runs(tokens: Sequence[int]) -> list[tuple[int, int, bool]]:
    """tokens as (start, end, is an image's) runs: text between images, each image's rows a run of its own."""
    runs, start = [], 0
    for i in range(1, len(tokens) + 1 if tokens else 0):
        if i == len(tokens) or is_media(tokens[i]) != is_media(tokens[start]) or (
                is_media(tokens[i]) and image_of(tokens[i]) != image_of(tokens[start])):
            runs.append((start, i, is_media(tokens[start])))
            start = i
    return runs


def image_start(tokens: Sequence[int], n: int) -> int:
    """n, or where the image n falls inside starts: a cache kept up to n keeps no image in part (an image read
    without a causal mask is read whole)."""
    if 0 < n < len(tokens) and is_media(tokens[n]) and is_media(tokens[n - 1]) \
            and image_of(tokens[n]) == image_of(tokens[n - 1]):
        return n - row_of(tokens[n])
    return n


class _Image:
    def __init__(self, data: bytes, tokens: list[int], n_rows: int, n_positions: int):
        self.data, self.tokens = data, tokens  # (the file's bytes: encoded again if its rows were let go)
        self.n_rows, self.n_positions = n_rows, n_positions  # as many rows as positions but under M-RoPE
        self.rows: np.ndarray | None = None


class Vision:
    """A multimodal projector loaded for a target model: turns images into the target's tokens and, when they
    are decoded, into embedding rows."""

    def __init__(self, model: Model, path: Path, threads: int, gpu: bool):
        from llama_cpp import mtmd_cpp

        check_is_gguf(path, "multimodal projector")
        self._mtmd = mtmd_cpp
        self._log_callback = llama.llama_log_callback(_log)  # kept referenced: libmtmd calls it later
        mtmd_cpp.mtmd_log_set(self._log_callback, ctypes.c_void_p(0))
        mtmd_cpp.mtmd_helper_log_set(self._log_callback, ctypes.c_void_p(0))
        params = mtmd_cpp.mtmd_context_params_default()
        params.use_gpu, params.n_threads, params.print_timings = gpu, threads, False
        self.path, self.model = Path(path), model
        recent_errors.clear()
        self._ctx = mtmd_cpp.mtmd_init_from_file(str(path).encode(), model.handle, params)
        if not self._ctx:
            reason = recent_errors[-1] if recent_errors else "not a multimodal projector, or a damaged file?"
            raise ModelLoadError(f"llama.cpp could not load the multimodal projector {path} for {model.path.name}:"
                                 f" {reason}")
        if not mtmd_cpp.mtmd_support_vision(self._ctx):
            self.close()
            raise UsageError(f"--mmproj {path}: it reads audio, which localspec does not read yet (images only)")
        # its model places an image's rows by M-RoPE (Qwen2-VL's family): on a grid of fewer positions than rows
        self.mrope = mtmd_cpp.mtmd_decode_use_mrope(self._ctx)
        self._width = llama.llama_model_n_embd_inp(model.handle)  # (the rows' width: the text model's input)
        self._ids: dict[str, int] = {}  # an image's sha256 -> its number
        self._images: OrderedDict[int, _Image] = OrderedDict()
        self.non_causal = False  # an image's rows see each other both ways (Gemma 3's): decoded whole, at once
        self.encodings = 0  # images encoded (a test counts what a cache saved)

    def image_tokens(self, data: bytes, which: str = "the image") -> list[int]:
        """An image's tokens in a prompt: those the model writes around an image (Gemma 3's <start_of_image>)
        and its positions' ids. InputError where it is no image llama.cpp decodes (PNG, JPEG, BMP, GIF, ...)."""
        key = hashlib.sha256(data).hexdigest()
        number = self._ids.get(key)
        if number is not None and number in self._images:
            self._images.move_to_end(number)
            return self._images[number].tokens
        if number is None:
            if len(self._ids) >= IMAGES:
                raise InputError("this process has read as many images as it can name: restart it")
            number = self._ids[key] = len(self._ids)
        tokens, n_rows, n_positions = [], 0, 0
        for kind, content, positions in self._chunks(data, which):
            if kind == "text":
                tokens += content
                continue
            if positions > ROWS_PER_IMAGE or positions != content and not self.mrope:
                raise InputError(f"{which} takes {content} rows at {positions} positions, which localspec does not"
                                 f" read (at most {ROWS_PER_IMAGE}, one position a row but under M-RoPE)")
            tokens += [-(1 + number * ROWS_PER_IMAGE + position) for position in range(positions)]
            n_rows, n_positions = content, positions
        self._images[number] = _Image(bytes(data), tokens, n_rows, n_positions)
        while len(self._images) > KEPT_IMAGES:  # (the least recently used: a cache holding it read it long ago)
            self._images.popitem(last=False)
        return tokens

    def holds(self, token: int) -> bool:
        """Whether the token is a row of an image this projector has read (an earlier exchange's tokens, handed
        back, may hold one)."""
        image = self._images.get(image_of(token)) if is_media(token) else None
        return image is not None and row_of(token) < image.n_positions

    def rows(self, tokens: Sequence[int]) -> np.ndarray:
        """The embedding rows of one image's ids (a run of media_runs; under M-RoPE all of them, and then every row),
        encoding the image where its rows are not kept."""
        image = self._image(tokens)
        if image.rows is None:
            image.rows = self._encode(image.data)
            self.encodings += 1
            encoded = [i for i in self._images.values() if i.rows is not None]
            for old in encoded[: max(0, len(encoded) - KEPT_ENCODED)]:
                old.rows = None
        if self.mrope:
            return image.rows
        first = row_of(tokens[0])
        return image.rows[first : first + len(tokens)]

    def positions(self, tokens: Sequence[int], start: int) -> np.ndarray:
        """Under M-RoPE, the positions of an image's rows (all of its ids given) where its first position is start:
        four a row, section-major (the row's t, y, x and z, llama_batch's layout of an embedding batch's), as
        libmtmd's helper places them."""
        mtmd = self._mtmd
        with self._tokenized(self._image(tokens).data, "an image") as chunks:
            for i in range(mtmd.mtmd_input_chunks_size(chunks)):
                chunk = mtmd.mtmd_input_chunks_get(chunks, i)
                if mtmd.mtmd_input_chunk_get_type(chunk) != mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                    continue
                image = mtmd.mtmd_input_chunk_get_tokens_image(chunk)
                found = [mtmd.mtmd_image_tokens_get_decoder_pos(image, start, row)
                         for row in range(mtmd.mtmd_image_tokens_get_n_tokens(image))]
                return np.array([[p.t for p in found], [p.y for p in found], [p.x for p in found],
                                 [p.z for p in found]], dtype=np.int32)
        raise InputError("an image of this prompt gave no image rows")

    def extra_cells(self, tokens: Sequence[int]) -> int:
        """The cells a cache holding these tokens needs beyond one a token: under M-RoPE, an image takes a cell a row
        at fewer positions."""
        if not self.mrope:
            return 0
        return sum(self._image(tokens[start:end]).n_rows - (end - start)
                   for start, end, image in media_runs(tokens) if image)

    def _image(self, tokens: Sequence[int]) -> _Image:
        image = self._images.get(image_of(tokens[0]))
        if image is None:
            raise InputError("an image of this prompt is no longer held: send the request again")
        self._images.move_to_end(image_of(tokens[0]))
        return image

    def close(self) -> None:
        if self._ctx:
            self._mtmd.mtmd_free(self._ctx)
            self._ctx = None

    def _chunks(self, data: bytes, which: str):
        """The chunks libmtmd makes of an image alone: ("text", tokens, n) and ("image", rows, positions)."""
        mtmd = self._mtmd
        with self._tokenized(data, which) as chunks:
            for i in range(mtmd.mtmd_input_chunks_size(chunks)):
                chunk = mtmd.mtmd_input_chunks_get(chunks, i)
                if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                    count = ctypes.c_size_t()
                    ids = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
                    yield "text", [ids[j] for j in range(count.value)], count.value
                else:
                    self.non_causal = self.non_causal or mtmd.mtmd_decode_use_non_causal(self._ctx, chunk)
                    yield ("image", mtmd.mtmd_input_chunk_get_n_tokens(chunk),
                           mtmd.mtmd_input_chunk_get_n_pos(chunk))

    def _encode(self, data: bytes) -> np.ndarray:
        mtmd = self._mtmd
        with self._tokenized(data, "an image") as chunks:
            for i in range(mtmd.mtmd_input_chunks_size(chunks)):
                chunk = mtmd.mtmd_input_chunks_get(chunks, i)
                if mtmd.mtmd_input_chunk_get_type(chunk) != mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                    continue
                n = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
                if mtmd.mtmd_encode_chunk(self._ctx, chunk) != 0:
                    raise InputError(f"llama.cpp could not encode an image with {self.path.name}")
                width = self._width
                return np.ctypeslib.as_array(mtmd.mtmd_get_output_embd(self._ctx),
                                             shape=(n * width,)).reshape(n, width).copy()
        raise InputError("an image of this prompt gave no image rows")

    @contextmanager
    def _tokenized(self, data: bytes, which: str):
        """libmtmd's chunks of an image alone, freed on leaving."""
        mtmd = self._mtmd
        buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data) if data else None
        bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(self._ctx, buffer, len(data), False) if data else None
        if not bitmap:
            raise InputError(f"{which} is not an image llama.cpp reads (PNG, JPEG, BMP, GIF, PSD, TGA, HDR, PNM)")
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            part = mtmd.mtmd_input_part(None, bitmap)
            parts = (ctypes.POINTER(mtmd.mtmd_input_part) * 1)(ctypes.pointer(part))
            if mtmd.mtmd_tokenize_from_parts(self._ctx, chunks, parts, 1, False) != 0:
                raise InputError(f"llama.cpp could not read {which} with {self.path.name}")
            yield chunks
        finally:
            mtmd.mtmd_input_chunks_free(chunks)
            mtmd.mtmd_bitmap_free(bitmap)
