"""localspec: local GGUF inference with lossless speculative decoding."""

__version__ = "0.1.0"
