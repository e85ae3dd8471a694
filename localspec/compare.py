"""`run --compare`: the same prompt decoded plainly right after the speculative run, so a user sees on
their own machine and prompt what speculation did: time, tokens per target pass, and whether the text
came out the same.

Both runs read the prompt from empty KV caches and are timed from the end of their prefill, so the
model file's pages (read once by the first prefill) favour neither. One run each: on a quiet machine
two runs of identical work differ by a few percent, which the verdict leaves as "no difference".
"""

from dataclasses import dataclass, replace

from .config import DrafterKind
from .request import Request
from .session import Session
from .stats import Recorder, Summary, record

NOISE = 0.05  # ratios within this of 1 are called no difference: one run each cannot tell them apart


@dataclass(frozen=True)
class Comparison:
    speculative: Summary
    plain: Summary
    mode: DrafterKind  # what drafted in the speculative run
    greedy: bool
    identical: bool
    first_difference: int | None  # the first character where the texts part; None when identical
    verify_costs: dict[int, float] | None  # verify(n) / verify(1) as auto measured them on this machine

    @property
    def speedup(self) -> float | None:
        return self.speculative.tokens_per_second / self.plain.tokens_per_second if self.plain.tokens_per_second else None

    def verdict(self) -> str:
        """One plain sentence: what paid, or why nothing did."""
        s, speedup = self.speculative, self.speedup
        if speedup is None or not s.tokens:
            return "nothing to compare: no tokens were generated"
        if not s.drafted:
            reason = ("auto expected no draft to beat a plain step on this machine"
                      + (f" (verifying 4 tokens costs {self.verify_costs[4]:.1f} plain steps here)"
                         if self.verify_costs and 4 in self.verify_costs else "")
                      if self.mode == DrafterKind.AUTO else "no drafter found anything to propose")
            return (f"nothing was drafted, so speculation could not pay: {reason}. Drafts pay where the answer"
                    " repeats its prompt (code edits, quotes), and on GPUs and Apple Silicon, where checking"
                    " several tokens costs about as much as one.")
        if speedup >= 1 + NOISE:
            return (f"speculation paid: {speedup:.2f}x the speed of plain decoding, {s.from_drafts} of {s.tokens} tokens"
                    f" from accepted drafts, {s.mean_accepted_length:.2f} tokens per target pass.")
        if speedup > 1 - NOISE:
            return (f"no clear difference ({speedup:.2f}x, within one run's noise): {s.accepted} of {s.drafted}"
                    " drafted tokens were accepted, too few or too dearly checked to gain here.")
        return (f"speculation lost: {speedup:.2f}x of plain decoding's speed; {s.accepted} of {s.drafted} drafted"
                " tokens were accepted, which did not pay for checking them on this machine.")

    def headline(self) -> str:
        """The line above the verdict: the ratio, said to be the machine's noise where both runs decoded plainly
        ("6.87x plain" read as a speedup beside "nothing was drafted"), and what the texts did."""
        if self.speedup is None:
            return self.text_note()
        noise = " (nothing was drafted: both runs decoded plainly, the difference is the machine's)"
        return f"{self.speedup:.2f}x plain{'' if self.speculative.drafted else noise}; {self.text_note()}"

    def text_note(self) -> str:
        if not self.greedy:
            return "the texts are two samples (temperature above 0): compare them with --temp 0"
        if self.identical:
            return "identical text"
        return (f"the texts part at character {self.first_difference}: the target checks drafts in batches, whose"
                " logits differ from one token's in the last bits, so where its two likeliest tokens nearly tie"
                " it can pick the other; both texts are the target's own greedy choices")

    def as_dict(self) -> dict:
        return {"plain": self.plain.as_dict(), "speedup": self.speedup, "identical_text": self.identical,
                "first_difference": self.first_difference, "verdict": self.verdict()}


def plain_beside(session: Session, request: Request, speculative: Recorder) -> Comparison:
    """Decode the request plainly from empty caches (without its prediction), and set it against the speculative
    run `speculative` recorded on the same session; the session drafts as before afterwards."""
    mode = session.mode
    session.reset()
    session.use(DrafterKind.PLAIN)
    try:
        plain = record(session.generate(replace(request, prediction=None)))
    finally:
        session.use(mode)
    ours, theirs = speculative.reasoning + speculative.text, plain.reasoning + plain.text
    parting = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    if parting is None and len(ours) != len(theirs):
        parting = min(len(ours), len(theirs))
    costs = session.costs()
    return Comparison(speculative.summary(), plain.summary(), mode, request.sampling.greedy, parting is None, parting,
                      costs["verify_relative"] if costs else None)
