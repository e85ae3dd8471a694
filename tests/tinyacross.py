"""Tiny drafts whose vocabularies are not the tiny target's (tinymodels.TARGET), for drafting across
vocabularies: a SentencePiece one that keeps some words whole which the target spells a character at a
time, in another order, and a GPT-2-style byte-level BPE one (as Qwen's, SmolLM2's and Llama 3's).

Each copies the target's layers, and the target's embedding and output rows for the tokens that spell the
same character, so its predictions follow the target's and its drafts are often accepted; a token of
several characters reads as its last and is predicted a little more readily than its first (so the draft
writes it where the target would write its first character, and the target's tokens cut its text
elsewhere). `favour` makes one token the draft's choice everywhere (a byte, a control token), to show that
a draft token with no text of its own ends the draft.
"""

from pathlib import Path

import gguf
import numpy as np

from tinymodels import N_EMBD, TinySpec, add_spm_tokenizer, attention_writer, finish, tiny_weights

# words the draft keeps whole that the target spells a character at a time (SentencePiece merges a piece
# only where its prefixes are pieces too)
# (what the tiny target writes: "ptrjk,ntwyyyj.gjrrrjk,jk,zwjk,zwjk,zuwjk...")
SPM_WORDS = ("jk", "jk,", "nt", "ntw", "zw", "\u2581t", "\u2581th", "\u2581the")
BPE_MERGES = (("j", "k"), ("jk", ","), ("n", "t"), ("nt", "w"), ("z", "w"), ("Ġ", "t"), ("Ġt", "h"), ("Ġth", "e"))
FAVOURED = 100.0  # how far the favoured token's logit stands above the rest


def gpt2_characters() -> dict[int, str]:
    """GPT-2's byte-level alphabet: the character each byte is written as in a byte-level BPE vocabulary."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return {byte: chr(byte) if byte in printable else chr(next(extra)) for byte in range(256)}


def _text(piece: str, byte_level: bool) -> str:
    """What a vocabulary entry spells."""
    if byte_level:
        back = {character: byte for byte, character in gpt2_characters().items()}
        return bytes(back[c] for c in piece).decode("utf-8", errors="replace")
    return piece.replace("\u2581", " ")


def write_tiny_across(path: Path, target: TinySpec, tokenizer: str, favour: str | None = None) -> Path:
    """tokenizer: "spm" or "bpe"; favour: a vocabulary entry the draft always predicts."""
    weights = tiny_weights(target)
    rows = {piece.replace("\u2581", " "): token for token, piece in enumerate(target.vocab)
            if token >= 259}  # the target's pieces, by the character each spells
    byte_level = tokenizer == "bpe"
    if byte_level:
        characters = gpt2_characters()
        vocab = [characters[b] for b in range(256)] + ["".join(pair) for pair in BPE_MERGES] + ["<|endoftext|>"]
    else:
        vocab = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + list(reversed(target.pieces)) \
            + list(SPM_WORDS)
    rng = np.random.default_rng(11)
    embedding = (rng.standard_normal((len(vocab), N_EMBD)) * 0.1).astype(np.float32)
    output = np.zeros((len(vocab), N_EMBD), np.float32)
    for token, piece in enumerate(vocab):
        if piece.startswith("<") and len(piece) > 1:
            continue  # control and byte tokens
        text = _text(piece, byte_level)
        if text[-1] in rows:
            embedding[token] = weights["token_embd.weight"][rows[text[-1]]]
        if text[0] in rows:
            # (longer words a little more readily: no two tokens' rows are the same)
            output[token] = weights["output.weight"][rows[text[0]]] * np.float32(1.0 + 0.05 * (len(text) - 1))
    if favour is not None:  # every token's embedding leans one way, which the favoured token's row reads
        embedding[:, 0] += np.float32(FAVOURED)
        output[vocab.index(favour)] = 0.0
        output[vocab.index(favour), 0] = FAVOURED
    tensors = {**weights, "token_embd.weight": embedding, "output.weight": output}

    writer = attention_writer(path)
    if byte_level:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("gpt-2")
        writer.add_token_list(vocab)
        writer.add_token_types([gguf.TokenType.NORMAL] * (len(vocab) - 1) + [gguf.TokenType.CONTROL])
        writer.add_token_merges([" ".join(pair) for pair in BPE_MERGES])
        writer.add_bos_token_id(len(vocab) - 1)
        writer.add_eos_token_id(len(vocab) - 1)
        writer.add_add_bos_token(False)
    else:
        # the words score above their characters, so that SentencePiece merges them
        add_spm_tokenizer(writer, tuple(vocab[259:]), scores=[-100.0 - i for i in range(len(target.pieces))]
                          + [-1.0 - i for i in range(len(SPM_WORDS))])
    finish(writer, tensors, path)
    return path
