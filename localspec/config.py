"""All tunable settings and their defaults, in one place.

Defaults follow llama.cpp's where one exists, so results are comparable.
"""

import os
from dataclasses import dataclass, field

import psutil

from .errors import UsageError


@dataclass(frozen=True)
class Sampling:
    """How a token is chosen from the target's logits. temperature 0 means greedy."""

    temperature: float = 0.8
    top_k: int = 40  # 0 disables
    top_p: float = 0.95  # 1.0 disables
    min_p: float = 0.05  # 0.0 disables
    seed: int | None = None

    def __post_init__(self):
        if self.seed == -1:  # llama.cpp's spelling of "a random seed"
            object.__setattr__(self, "seed", None)
        if self.seed is not None and self.seed < 0:
            raise UsageError(f"seed must be >= 0, or -1 for a random one, got {self.seed}")
        if not self.temperature >= 0:
            raise UsageError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise UsageError(f"top-k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise UsageError(f"top-p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p < 1.0:
            raise UsageError(f"min-p must be in [0, 1), got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


POLICIES = ("auto", "fixed", "off")
# auto: n-gram drafts of copied text pay up to long lengths (a 2-core CPU verifies 32 tokens in
# the time of 7 single ones); the policy stops short whenever acceptance does not carry that far.
DRAFT_MAX = {"auto": 32, "fixed": 3, "off": 0}


@dataclass(frozen=True)
class Speculation:
    """How speculation is steered.

    policy "auto" chooses each step between plain decoding, n-gram lookup and the
    draft model by measured cost and acceptance; "fixed" always drafts up to
    draft_max tokens with the chosen drafter; "off" is plain decoding. draft_max
    defaults by policy (measured on a 2-core CPU: fixed drafting beyond 3 tokens
    costs more than it wins; auto stops short by itself). p_min stops a model
    draft once the draft model is unsure of its next token; ngram_min..ngram_max
    is the range of suffix lengths looked up by the n-gram drafter, longest first.
    """

    policy: str = "auto"
    draft_max: int | None = None
    draft_min: int = 0
    p_min: float = 0.6
    ngram_min: int = 2
    ngram_max: int = 4

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise UsageError(f"--spec must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.draft_max is None:
            object.__setattr__(self, "draft_max", DRAFT_MAX[self.policy])
        if self.draft_max < 0:
            raise UsageError(f"draft-max must be >= 0, got {self.draft_max}")
        if not 0 <= self.draft_min <= self.draft_max:
            raise UsageError(
                f"draft-min must be between 0 and draft-max ({self.draft_max}), got {self.draft_min}"
            )
        if not 0.0 <= self.p_min <= 1.0:
            raise UsageError(f"p-min must be in [0, 1], got {self.p_min}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise UsageError(
                f"n-gram sizes need 1 <= min <= max, got {self.ngram_min}..{self.ngram_max}"
            )


def default_threads() -> int:
    # Hyper-threads slow llama.cpp's matmuls down: one thread per physical core.
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


@dataclass(frozen=True)
class Runtime:
    """Resources for the llama.cpp contexts. gpu_layers -1 offloads every layer."""

    ctx_size: int = 4096
    threads: int = field(default_factory=default_threads)
    gpu_layers: int = -1
    draft_gpu_layers: int = -1
    # Offload devices by name (llama.cpp's --device / --device-draft; ("none",): none); None: all of them.
    devices: tuple[str, ...] | None = None
    draft_devices: tuple[str, ...] | None = None
    prompt_batch: int = 512
    # Run the sampler chain inside the decode graph (None: where the target runs on a GPU). Target
    # and draft always sample the same way, so p and q come from the same chain.
    backend_sampling: bool | None = None

    def __post_init__(self):
        if self.ctx_size < 8:
            raise UsageError(f"ctx-size must be at least 8, got {self.ctx_size}")
        if self.threads < 1:
            raise UsageError(f"threads must be >= 1, got {self.threads}")
        logical = os.cpu_count() or 1
        if self.threads > logical:
            raise UsageError(f"threads must be at most {logical}, this machine's logical CPUs (more threads than CPUs"
                             f" only slow llama.cpp down), got {self.threads}")
        if self.gpu_layers < -1 or self.draft_gpu_layers < -1:
            raise UsageError("gpu layers must be >= 0, or -1 for all layers")


@dataclass(frozen=True)
class Limits:
    """When a generation ends, besides the context filling up."""

    max_tokens: int = 512
    stop: tuple[str, ...] = ()

    def __post_init__(self):
        if self.max_tokens < 1:
            raise UsageError(f"max-tokens must be >= 1, got {self.max_tokens}")
        if any(s == "" for s in self.stop):
            raise UsageError("a stop string cannot be empty")
