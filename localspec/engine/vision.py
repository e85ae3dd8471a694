"""Images and audio read by the target through its multimodal projector (llama.cpp's libmtmd, `--mmproj`).

A prompt's tokens hold an image as a run of ids below 0, which no vocabulary reaches: one block of ids an image,
one id a position it takes, so that the token bookkeeping every cache does (a chat's earlier turns, a sequence's
reuse, the drafters' histories, positions as indices) holds images too, and the same image in the same place reads
as the same tokens. The target's context decodes such a run as the projector's embedding rows (Context.media):
a row a position, or, where the model places rows by M-RoPE (Qwen2-VL's family), all of the image's rows at the
positions libmtmd gives them, in fewer positions than rows. Any other context (a draft model's, which never saw
the image) reads a stand-in token at each position, as llama.cpp's speculative drafting reads zero rows there. An
image is encoded only when its rows are decoded: a turn that finds it cached costs no encoding.

An audio file (WAV, MP3, FLAC) is read as an image is, by a projector with an audio encoder (Qwen2-Audio's, Ultravox's,
Voxtral's, Gemma's): libmtmd makes a chunk of rows of each 30 seconds of it, one position a row (under M-RoPE all four
of a row's positions the same), which its ids take one after another. Below, "image" stands for either.
"""

import ctypes
import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..errors import EngineError, InputError, ModelLoadError, UsageError
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


def is_audio(data: bytes) -> bool:
    """Whether the bytes are an audio file libmtmd decodes (WAV, MP3, FLAC), by its own test of their first bytes."""
    return len(data) >= 12 and (data[:4] == b"RIFF" and data[8:12] == b"WAVE" or data[:3] == b"ID3"
                                or data[0] == 0xFF and data[1] & 0xE0 == 0xE0 or data[:4] == b"fLaC")


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


class _Chunk(NamedTuple):
    """One of libmtmd's chunks of rows of a file (an image, or 30 seconds of audio): where its ids and its rows start
    among the file's, and how many (as many rows as positions but for an image under M-RoPE)."""

    audio: bool
    position: int
    n_positions: int
    row: int
    n_rows: int


class _Image:
    def __init__(self, data: bytes, tokens: list[int], chunks: list[_Chunk]):
        self.data, self.tokens, self.chunks = data, tokens, chunks  # (its bytes: encoded again if its rows went)
        self.n_positions = sum(chunk.n_positions for chunk in chunks)
        self.rows: np.ndarray | None = None

    def covered(self, tokens: Sequence[int]) -> list[_Chunk]:
        """The chunks a run of its ids reaches into."""
        first, last = row_of(tokens[0]), row_of(tokens[-1])
        return [chunk for chunk in self.chunks if chunk.position <= last and first < chunk.position + chunk.n_positions]


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
        self.sees, self.hears = mtmd_cpp.mtmd_support_vision(self._ctx), mtmd_cpp.mtmd_support_audio(self._ctx)
        if not (self.sees or self.hears):
            self.close()
            raise UsageError(f"--mmproj {path}: it reads neither images nor audio (a projector that writes audio?)")
        # its model places an image's rows by M-RoPE (Qwen2-VL's family): on a grid of fewer positions than rows
        self.mrope = mtmd_cpp.mtmd_decode_use_mrope(self._ctx)
        self._width = llama.llama_model_n_embd_inp(model.handle)  # (the rows' width: the text model's input)
        self._ids: dict[str, int] = {}  # an image's sha256 -> its number
        self._images: OrderedDict[int, _Image] = OrderedDict()
        self.non_causal = False  # an image's rows see each other both ways (Gemma 3's): decoded whole, at once
        self.encodings = 0  # images encoded (a test counts what a cache saved)

    def image_tokens(self, data: bytes, which: str = "the image") -> list[int]:
        """An image's (or audio file's) tokens in a prompt: those the model writes around it (Gemma 3's
        <start_of_image>, Qwen2-Audio's <|audio_bos|>) and its positions' ids. InputError where it is no image or
        audio llama.cpp decodes (PNG, JPEG, BMP, GIF, ...; WAV, MP3, FLAC), or one the projector does not read."""
        key = hashlib.sha256(data).hexdigest()
        number = self._ids.get(key)
        if number is not None and number in self._images:
            self._images.move_to_end(number)
            return self._images[number].tokens
        if number is None:
            if len(self._ids) >= IMAGES:
                raise InputError("this process has read as many images as it can name: restart it")
            number = self._ids[key] = len(self._ids)
        tokens, chunks, position, row = [], [], 0, 0
        for kind, content, positions in self._chunks(data, which):
            if kind == "text":
                tokens += content
                continue
            if position + positions > ROWS_PER_IMAGE or positions != content and not self.mrope:
                raise InputError(f"{which} takes {row + content} rows at {position + positions} positions, which"
                                 f" localspec does not read (at most {ROWS_PER_IMAGE}, one position a row but for"
                                 " an image under M-RoPE)")
            tokens += [-(1 + number * ROWS_PER_IMAGE + p) for p in range(position, position + positions)]
            chunks.append(_Chunk(kind == "audio", position, positions, row, content))
            position, row = position + positions, row + content
        self._images[number] = _Image(bytes(data), tokens, chunks)
        while len(self._images) > KEPT_IMAGES:  # (the least recently used: a cache holding it read it long ago)
            self._images.popitem(last=False)
        return tokens

    def holds(self, token: int) -> bool:
        """Whether the token is a row of an image this projector has read (an earlier exchange's tokens, handed
        back, may hold one)."""
        image = self._images.get(image_of(token)) if is_media(token) else None
        return image is not None and row_of(token) < image.n_positions

    def rows(self, tokens: Sequence[int]) -> np.ndarray:
        """The embedding rows of one image's ids (a run of media_runs; under M-RoPE whole chunks of them, and then
        every row of those), encoding the image where its rows are not kept."""
        image = self._image(tokens)
        if image.rows is None:
            image.rows = self._encode(image.data)
            self.encodings += 1
            encoded = [i for i in self._images.values() if i.rows is not None]
            for old in encoded[: max(0, len(encoded) - KEPT_ENCODED)]:
                old.rows = None
        if self.mrope:
            covered = image.covered(tokens)
            return image.rows[covered[0].row : covered[-1].row + covered[-1].n_rows]
        first = row_of(tokens[0])  # (rows and positions one to one)
        return image.rows[first : first + len(tokens)]

    def positions(self, tokens: Sequence[int], start: int) -> np.ndarray:
        """Under M-RoPE, the positions of the rows of an image's ids (whole chunks of them) where the first is at
        start: four a row, section-major (the row's t, y, x and z, llama_batch's layout of an embedding batch's), as
        libmtmd's helper places them (audio's rows at one position each, the same in all four)."""
        mtmd, image = self._mtmd, self._image(tokens)
        covered, first, placed = image.covered(tokens), row_of(tokens[0]), []
        with self._tokenized(image.data, "an image") as chunks:
            for kept, chunk in zip(image.chunks, self._media_chunks(chunks), strict=True):
                if kept not in covered:
                    continue
                at = start + kept.position - first
                if kept.audio:
                    placed.append(np.tile(np.arange(at, at + kept.n_rows, dtype=np.int32), (4, 1)))
                    continue
                grid = mtmd.mtmd_input_chunk_get_tokens_image(chunk)
                found = [mtmd.mtmd_image_tokens_get_decoder_pos(grid, at, row) for row in range(kept.n_rows)]
                placed.append(np.array([[p.t for p in found], [p.y for p in found], [p.x for p in found],
                                        [p.z for p in found]], dtype=np.int32))
        return np.concatenate(placed, axis=1)

    def extra_cells(self, tokens: Sequence[int]) -> int:
        """The cells a cache holding these tokens needs beyond one a token: under M-RoPE, an image takes a cell a row
        at fewer positions."""
        if not self.mrope:
            return 0
        return sum(chunk.n_rows - chunk.n_positions for start, end, image in media_runs(tokens) if image
                   for chunk in self._image(tokens[start:end]).covered(tokens[start:end]))

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
        """The chunks libmtmd makes of an image alone: ("text", tokens, n), ("image" or "audio", rows, positions)."""
        mtmd = self._mtmd
        with self._tokenized(data, which) as chunks:
            for kind, chunk in self._each(chunks):
                if kind == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                    count = ctypes.c_size_t()
                    ids = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
                    yield "text", [ids[j] for j in range(count.value)], count.value
                else:
                    self.non_causal = self.non_causal or mtmd.mtmd_decode_use_non_causal(self._ctx, chunk)
                    yield ("audio" if kind == mtmd.MTMD_INPUT_CHUNK_TYPE_AUDIO else "image",
                           mtmd.mtmd_input_chunk_get_n_tokens(chunk), mtmd.mtmd_input_chunk_get_n_pos(chunk))

    def _each(self, chunks):
        """libmtmd's chunks, each with its type."""
        mtmd = self._mtmd
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            yield mtmd.mtmd_input_chunk_get_type(chunk), chunk

    def _media_chunks(self, chunks):
        """The chunks of rows (an image's, or 30 seconds of audio's), in order."""
        return (chunk for kind, chunk in self._each(chunks) if kind != self._mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT)

    def _encode(self, data: bytes) -> np.ndarray:
        """Every row of an image's chunks, in order."""
        mtmd, encoded = self._mtmd, []
        with self._tokenized(data, "an image") as chunks:
            for chunk in self._media_chunks(chunks):
                n = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
                if mtmd.mtmd_encode_chunk(self._ctx, chunk) != 0:
                    raise InputError(f"llama.cpp could not encode an image with {self.path.name}")
                width = self._width
                encoded.append(np.ctypeslib.as_array(mtmd.mtmd_get_output_embd(self._ctx),
                                                     shape=(n * width,)).reshape(n, width).copy())
        if not encoded:
            raise InputError("an image of this prompt gave no image rows")
        return np.concatenate(encoded)

    @contextmanager
    def _tokenized(self, data: bytes, which: str):
        """libmtmd's chunks of an image alone, freed on leaving."""
        mtmd = self._mtmd
        audio = is_audio(data)
        if audio and not self.hears or not audio and data and not self.sees:
            raise InputError(f"{which} is {'audio' if audio else 'an image'}, which {self.path.name} does not read (it"
                             f" reads {'images' if audio else 'audio'}: a model that reads both has a projector for"
                             " each)")
        buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data) if data else None
        bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(self._ctx, buffer, len(data), False) if data else None
        if not bitmap:
            kinds = (["an image llama.cpp reads (PNG, JPEG, BMP, GIF, PSD, TGA, HDR, PNM)"] if self.sees else []) + (
                ["audio llama.cpp decodes (WAV, MP3, FLAC)"] if self.hears else [])
            raise InputError(f"{which} is not {' or '.join(kinds)}")
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


class MediaDecoding:
    """A part of Context: decoding a prompt's images, each image's rows as the projector's embeddings (Context.media)
    at plain or M-RoPE positions, with the text between them as tokens."""

    def _decode_media(self, tokens: Sequence[int], logits: str) -> None:
        """Decode tokens that hold images: each image's rows as its embeddings (the projector's), the text between
        as tokens; rows kept of the last run alone."""
        if logits == "all":
            raise EngineError("an image's rows are read, not verified")
        runs = media_runs(tokens)
        for start, end, image in runs:
            run, last = tokens[start:end], logits if end == len(tokens) else "none"
            if not image:
                self.decode(run, last)
                continue
            if self.media.non_causal and len(run) > self.n_batch:
                raise InputError(f"an image takes {len(run)} rows, which this model reads in one batch: raise"
                                 f" --batch-size to {len(run)} at least")
            if self.media.non_causal:
                llama.llama_set_causal_attn(self._ctx, False)
            try:
                if self.media.mrope:
                    self._decode_mrope(run, last)
                else:
                    self.decode(run, last, hidden=self.media.rows(run), embedded=True)
            finally:
                if self.media.non_causal:
                    llama.llama_set_causal_attn(self._ctx, True)

    def _decode_mrope(self, run: Sequence[int], logits: str) -> None:
        """Decode an image's rows at the M-RoPE positions libmtmd gives them, from the next position on, in batches
        of n_batch rows: its ids, one a position, are what the cache then holds (positions stay indices, the rows'
        cells more than they)."""
        self._settle()
        start, batch = len(self.tokens), self._batch
        rows = self.media.rows(run)
        positions = self.media.positions(run, start)
        self._changing = (start, run)
        for offset in range(0, len(rows), self.n_batch):
            piece = rows[offset : offset + self.n_batch]
            for i in range(len(piece)):
                batch.n_seq_id[i], batch.seq_id[i][0] = 1, self.seq
                batch.logits[i] = logits == "last" and offset + i == len(rows) - 1
            batch.n_tokens = len(piece)
            placed = positions[:, offset : offset + len(piece)].ravel()  # (section-major)
            status = self._run(llama.llama_decode, piece, tokens=False, positions=placed)
            if status != 0:
                self.truncate(start)
                raise EngineError(f"llama_decode failed with status {status} on an image at position {start}")
        if self.hidden.layers:  # (its rows are not a position's each: drafters that read them read zeros there)
            self.hidden.keep(start, np.zeros((len(run), self.hidden.width), dtype=np.float32))
        self.tokens.extend(run)
        self._last_decoded, self._rolled_back, self._row_base, self._row_last = len(rows), False, 0, -1
        self._changing = None
