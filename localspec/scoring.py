"""What a Session reads rather than generates: a text's log probabilities (perplexity), an input's embedding, a
reranker's scores; each on a context of the target's own beside the generation's, steered and adapted as it is."""

from .engine.adapters import steer
from .engine.backend import Context
from .engine.embedder import Embedder, normalized
from .engine.speculative import scored
from .errors import ContextOverflow, InputError, UsageError
from .events import Logprobs
from .loading import scoring_context


class Scoring:
    """A part of Session, which holds the target (target_model, target, sequences, target_info), its prompts, its
    adapters and steering, the runtime it was loaded with, and what it owns and closes (_own)."""

    _scorer: Context | None = None  # made at the first text scored
    _embedder: Embedder | None = None  # made at the first embedding asked for

    def score(self, tokens: list[int], top: int = 0, start: int = 1) -> tuple[Logprobs, ...]:
        """Each token's log probability given those before it, with the `top` likeliest beside it, from
        `start` on (the logprob of those before it None: they are read as a prompt is, faster): a text's
        perplexity. Read as llama-perplexity reads a chunk, in batches of --batch-size with a row of every
        token, on a context of its own (made at the first call, again for a longer text), so the sequences'
        caches are left as they were; a model with a recurrent state is read on the first sequence (not while
        a scheduler generates), in batches as long as a draft's verification."""
        tokens = self.prompts.token_ids(tokens)
        if len(tokens) > self.target.n_ctx:
            raise ContextOverflow(f"{len(tokens)} tokens cannot fit the context of {self.target.n_ctx}; raise"
                                  " --ctx-size or score fewer")
        if not 1 <= start <= len(tokens):
            raise UsageError(f"start: a token from 1 to {len(tokens)} to score from, got {start}")
        context = self._scoring_context(len(tokens))
        if context is self.target:
            self._adapt(self.adapters.scales)
        else:
            self.adapters.apply(context, self.adapters.scales)  # (the defaults, which serve's POST may change)
        return scored(context, tokens, top, start)

    def _scoring_context(self, n: int) -> Context:
        # a recurrent state takes rows back only as far as it keeps snapshots, which a context of all rows would
        # keep for every token: such a model scores on the generation's own context
        if self.target_model.recurrent:
            return self.sequences[0]
        if self._scorer is None or self._scorer.n_ctx < n:
            if self._scorer is not None:
                self._owned.remove(self._scorer)
                self._scorer.close()
                self._scorer = None
            self._scorer = self._steered(self._own(scoring_context(self.target_model, n, self._runtime)))
        return self._scorer

    def _steered(self, context):
        """A context of the target's own beside the generation's (scoring, embedding), steered as the target is."""
        if self._steering:
            steer(context, *self._steering)
        return context

    def embed(self, tokens: list[int], norm: int = 2, dimensions: int | None = None) -> list[float]:
        """One input's vector (embedding_inputs' tokens), the target model reading it whole and pooling it
        (an embedding context of the session's size is made at the first call), normalized as norm says (-1 not,
        0 max-abs to int16's range, 2 unit length, p unit p-norm: llama-server's embd_normalize); dimensions: only
        its first that many kept, before it is normalized (OpenAI's and Ollama's shortening, which Matryoshka-trained
        models such as nomic-embed-text v1.5 are made for)."""
        if self.ranks:
            raise InputError(f"{self.target_info.path.name} is a reranker (rank pooling): it scores documents"
                             " against a query (serve's /v1/rerank) and gives no embedding")
        return normalized(self._pooled(tokens)[:dimensions], norm).tolist()

    def relevance(self, tokens: list[int]) -> float:
        """A reranker's relevance score for one of ranking_inputs' query-document pairs, as llama.cpp computes it
        (the classifier's first output: a logit for BGE's and Jina's rerankers, P(yes) for Qwen3-Reranker's)."""
        self._must_rank()
        return float(self._pooled(tokens)[0])

    def ranking_inputs(self, query: str, documents: list[str], most_document_tokens: int | None = None) -> list[list[int]]:
        """The query-document pairs a reranker scores (Prompts.ranking_inputs); InputError, before any is read, where
        the model is no reranker."""
        self._must_rank()
        return self.prompts.ranking_inputs(query, documents, most_document_tokens)

    def rerank(self, query: str, documents: list[str]) -> list[float]:
        """Each document's relevance to the query (relevance's score), in the documents' order: higher is more
        relevant."""
        return [self.relevance(pair) for pair in self.ranking_inputs(query, documents)]

    @property
    def ranks(self) -> bool:
        """Whether the target reranks (its metadata's rank pooling, or --pooling rank) rather than embeds."""
        pooling = self._runtime.pooling
        return pooling == "rank" if pooling else self.target_info.ranks

    def _must_rank(self) -> None:
        info = self.target_info
        if not self.ranks:
            # (community conversions of Qwen3-Reranker left out its head and metadata: llama-server scored 4.5e-23)
            named = " Its name says reranker but its file says nothing of rank pooling: a conversion that left the" \
                    " classifier out? Take one converted by llama.cpp's convert_hf_to_gguf.py" \
                    if "rerank" in info.path.name.lower() else ""
            raise InputError(f"{info.path.name} is not a reranker: it {'generates' if info.generates else 'embeds'}"
                             " text. Reranking takes a model whose GGUF pools by rank (bge-reranker, jina-reranker,"
                             f" Qwen3-Reranker).{named}")
        if not info.classifies:
            raise InputError(f"--pooling rank: {info.path.name} has no classifier head (cls.weight or cls.output.weight),"
                             " so its scores would be a number of its hidden state; take a reranker's GGUF")

    def _pooled(self, tokens: list[int]):
        if self._embedder is None:
            self._embedder = self._steered(self._own(Embedder(self.target_model, self.target.n_ctx,
                                                              self._runtime.threads, self._runtime.pooling)))
        self.adapters.apply(self._embedder, self.adapters.scales)
        return self._embedder.embed(tokens)
