"""One generation asked of a session: what every face hands the library (serve's protocols, batch, run,
chat, bench, a program that imports localspec)."""

from dataclasses import dataclass

from .config import DrafterKind, Limits, Sampling, Thinking
from .tool_calls import Tools


@dataclass(frozen=True)
class Request:
    """What to answer and how.

    messages: a conversation (role and content each), rendered with the model's chat template for the
    assistant's turn; prompt: instead, text read as written (control tokens and all, as OpenAI's and
    llama.cpp's completions read it) or token ids. sampling: how tokens are chosen, a grammar or JSON
    schema's among it (prompts.output_grammar makes one); limits: how long it may run and where it stops.
    prediction: the text the answer is expected to follow (OpenAI's Predicted Outputs), drafted wherever
    it does, or its tokens as Session.prediction_tokens made them. tools: the tools a conversation's answer may call, their calls kept well formed by a grammar.
    thinking: how a reasoning model thinks before it answers (whether, how hard, how long).
    drafting, draft_max: how this generation drafts, other than the session's mode and --draft-max where given
    (serve's per-request speculation): plain for one request leaves the others drafting.
    client: whose request it is (serve's API key): it drafts only from its own client's earlier answers
    and reuses no cache another client filled."""

    sampling: Sampling = Sampling()
    limits: Limits = Limits()
    messages: list[dict] | None = None
    prompt: str | list[int] | None = None
    prediction: str | list[int] | None = None
    tools: Tools | None = None
    client: str | None = None
    thinking: Thinking = Thinking()
    drafting: DrafterKind | None = None
    draft_max: int | None = None

    @property
    def characters(self) -> int:
        """The length of the prompt's text (of its messages' contents; 0 for token ids)."""
        if self.messages is not None:
            return sum(len(message["content"]) for message in self.messages)
        return len(self.prompt) if isinstance(self.prompt, str) else 0
