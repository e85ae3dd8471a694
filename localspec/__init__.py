"""localspec: local GGUF inference with lossless speculative decoding.

The front door, which localspec's own commands, server and benchmarks use as well:

    import localspec

    with localspec.load("qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b") as session:
        reply = session.complete("Write a haiku about the sea.", temperature=0, max_tokens=64)
        print(reply.text, reply.summary.tokens_per_second)

docs/library.md says the rest: streaming events, chats with history, the settings load() takes.
"""

__version__ = "0.1.0"

# name -> the module that defines it; imported when first asked for, so that `import localspec` (and the
# CLI's --help) does not load the models' machinery until it is used
_EXPORTS = {
    **dict.fromkeys(("load", "Session", "Conversation", "Reply", "Info"), "session"),
    "output_grammar": "prompts",
    "speculating": "drafting",
    **dict.fromkeys(("Request", "Opening", "IMAGE_MARKER"), "request"),
    **dict.fromkeys(("Scheduler", "Running", "ENDED"), "scheduler"),
    **dict.fromkeys(("Sampling", "Limits", "Runtime", "Rope", "Adapter", "Speculation", "DrafterKind", "Thinking"),
                    "config"),
    **dict.fromkeys(("Event", "Reading", "Prefill", "Token", "Step", "Done"), "events"),
    **dict.fromkeys(("Recorder", "Summary"), "stats"),
    **dict.fromkeys(("LocalspecError", "UsageError", "InputError", "ContextOverflow", "ModelLoadError", "FetchError",
                     "EngineError"), "errors"),
    **dict.fromkeys(("Tools", "ToolCall"), "tool_calls"),
}
__all__ = ["__version__", *_EXPORTS]


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'localspec' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
