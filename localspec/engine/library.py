"""llama-cpp-python's library and ggml's, loaded on first use: the engine's modules reach llama.cpp
through `llama` here and ggml's own C API (which llama-cpp-python does not wrap) through ggml()."""

import ctypes
import os
import signal
import sys
import tempfile
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

LOG_LEVEL_ERROR = 4  # enum ggml_log_level
recent_errors: deque[str] = deque(maxlen=4)  # llama.cpp's own words, for our error messages


# llama.cpp narrates every load to stderr; users see it only with LOCALSPEC_DEBUG=1. Read once: on CUDA ggml
# says a line at every decode, which then costs a call into Python and no more.
SHOWING_ITS_LOG = bool(os.environ.get("LOCALSPEC_DEBUG"))


def _log(level, text, user_data):
    if level == LOG_LEVEL_ERROR and text.strip():
        recent_errors.append(text.decode("utf-8", errors="replace").strip())
    if SHOWING_ITS_LOG:
        sys.stderr.write(text.decode("utf-8", errors="replace"))


_CAPTURING = threading.Lock()
_captured_into = []  # the one file C's stderr is caught in, made at its first use (a grammar per request)


@contextmanager
def c_stderr_captured() -> Iterator[list[str]]:
    """What C code writes to the process's stderr itself meanwhile (llama.cpp's grammar parser says its errors
    with fprintf, not through its log), into the list yielded once the block ends; the caller writes back what is
    not its to keep (another thread's lines, in a server)."""
    sys.stderr.flush()
    said: list[str] = []
    with _CAPTURING:  # (two at once would leave stderr on the first one's file)
        if not _captured_into:
            _captured_into.append(tempfile.TemporaryFile())
        written = _captured_into[0]
        written.seek(0)
        written.truncate()
        kept = os.dup(2)
        os.dup2(written.fileno(), 2)
        try:
            yield said
        finally:
            os.dup2(kept, 2)
            os.close(kept)
            written.seek(0)
            said.append(written.read().decode("utf-8", errors="replace"))


@contextmanager
def ctrl_c_held() -> Iterator[list]:
    """Ctrl-C pressed during the block (models loading, contexts made: llama.cpp calls back into Python meanwhile)
    noted in the list yielded, for the caller to act on once llama.cpp returns: Python raises it at the first line
    of whatever callback runs next, and ctypes drops what a callback raises, so the load went on as if nothing was
    pressed. Only on the main thread, under Python's own handler (signals go nowhere else); a block inside another
    shares its list."""
    global _pressed
    if _pressed is not None or threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield _pressed if _pressed is not None else []
        return
    pressed = _pressed = []
    signal.signal(signal.SIGINT, lambda *_: pressed.append(True))
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _pressed = None


_pressed: list | None = None  # the list of the ctrl_c_held block running


class _OnFirstUse:
    """llama-cpp-python, imported and initialised when first used: loading its library takes a
    noticeable moment, and `localspec --help`, `models` or `pull` never need it. Once loaded, the
    module's names are this object's own, so each later lookup costs what a module's does."""

    def __getattr__(self, name: str):
        import llama_cpp

        if "_log_callback" not in self.__dict__:
            self._log_callback = llama_cpp.llama_log_callback(_log)  # kept referenced: llama.cpp calls it later
            llama_cpp.llama_log_set(self._log_callback, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            self.__dict__.update({key: value for key, value in vars(llama_cpp).items() if key not in self.__dict__})
        return getattr(llama_cpp, name)


llama = _OnFirstUse()


def nextn():
    """llama.cpp's calls for multi-token prediction (llama-ext.h), which llama-cpp-python binds in a
    module of their own, marked experimental: the pinned version is the one they are tested with."""
    llama.llama_backend_init  # noqa: B018 (initialises llama.cpp first)
    from llama_cpp import llama_cpp_ext

    return llama_cpp_ext


class _LayerInputs:
    """llama.cpp's calls (llama-ext.h) for the inputs of a target's layers, as EAGLE-3 reads them, and the
    layers an EAGLE-3 drafter names. llama-cpp-python binds none of them; the library exports them under
    their C++ names."""

    def __init__(self, lib: ctypes.CDLL):
        context, model = ctypes.c_void_p, ctypes.c_void_p
        self.set_layer_input = _bound(lib, "llama_set_embeddings_layer_inp",
                                      "_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
                                      [context, ctypes.c_uint32, ctypes.c_bool], None)
        self.layer_input = _bound(lib, "llama_get_embeddings_layer_inp",
                                  "_Z30llama_get_embeddings_layer_inpP13llama_contextj",
                                  [context, ctypes.c_uint32], ctypes.POINTER(ctypes.c_float))
        self._ids = _bound(lib, "llama_model_target_layer_ids", "_Z28llama_model_target_layer_idsPK11llama_model",
                           [model], ctypes.POINTER(ctypes.c_int32))
        self._count = _bound(lib, "llama_model_target_layer_ids_n",
                             "_Z30llama_model_target_layer_ids_nPK11llama_model", [model], ctypes.c_uint32)

    def target_layers(self, model) -> tuple[int, ...]:
        ids = self._ids(model)
        return tuple(ids[i] for i in range(self._count(model))) if ids else ()


def _bound(lib: ctypes.CDLL, *names_then_types):
    *names, argtypes, restype = names_then_types
    function = next((getattr(lib, name) for name in names if hasattr(lib, name)), None)
    if function is None:
        raise AttributeError(f"llama.cpp's library exports none of {', '.join(names)}")
    function.argtypes, function.restype = argtypes, restype
    return function


@cache
def layer_inputs() -> _LayerInputs:
    return _LayerInputs(nextn()._lib)


def grammars():
    """llama-cpp-python's grammar helpers: its port of llama.cpp's JSON-schema-to-GBNF converter
    (json_schema_to_gbnf) and llama.cpp's grammar for any JSON object (JSON_GBNF)."""
    from llama_cpp import llama_grammar

    return llama_grammar


def library(name: str) -> Path:
    """One of the libraries llama-cpp-python installs beside itself, by its name without prefix or suffix:
    the file libllama itself loaded. A wheel cannot hold symbolic links, so libggml.so and libggml.so.0
    are separate copies, and loading the other one would give a second ggml with a registry of its own
    (devices added there are not llama.cpp's). LLAMA_CPP_LIB_PATH moves them, for llama-cpp-python as for us."""
    override = os.environ.get("LLAMA_CPP_LIB_PATH")
    folder = Path(override) if override else Path(llama.__file__).parent / "lib"
    names = (f"lib{name}.so.0", f"lib{name}.so", f"lib{name}.0.dylib", f"lib{name}.dylib", f"{name}.dll")
    return next(folder / file for file in names if (folder / file).exists())


@cache
def ggml() -> ctypes.CDLL:
    """ggml's device registry, which llama-cpp-python does not wrap."""
    ggml = ctypes.CDLL(str(library("ggml")))
    ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_dev_get.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    for function in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
        getattr(ggml, function).restype = ctypes.c_char_p
        getattr(ggml, function).argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_dev_type.restype = ctypes.c_int
    ggml.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
    ggml.ggml_backend_dev_by_name.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_by_name.argtypes = [ctypes.c_char_p]
    ggml.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_reg_name.restype = ctypes.c_char_p
    ggml.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_register.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_dev_buffer_type.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_buffer_type.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_buft_name.restype = ctypes.c_char_p
    ggml.ggml_backend_buft_name.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    ggml.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    return ggml


def version() -> str:
    """llama-cpp-python's version: its module's own, as a binding run from a source tree has no installed
    distribution to ask (scripts/accelerator-report runs it so)."""
    return llama.__version__


def system_info() -> str:
    """llama.cpp's summary of the CPU features and backends it was built with."""
    return llama.llama_print_system_info().decode("utf-8", errors="replace").strip()
