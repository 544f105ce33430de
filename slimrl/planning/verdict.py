"""Will the run fit? Three answers a user can act on: "fits", "uncertain — measure with slimrl compare", "does not fit".

The planner predicts the peak of *allocated* bytes on CUDA (what ``torch.cuda.max_memory_allocated`` reports). A card
of ``B`` bytes first loses the CUDA context (:data:`slimrl.compat.gpus.CUDA_CONTEXT_BYTES`, outside that count, the
plan's ``runtime`` phase); of the rest, ``usable = B - context``, PyTorch's caching allocator cannot hand out all:
it rounds blocks up and fragments around the largest ones (full logits, masks, the head's chunks), so a run stops
with "CUDA out of memory" at an allocated peak somewhere below ``usable``, by an amount no single margin reproduces.

The band is measured, not guessed: TRL v1.15.0 published, for ten runs on a 79 GiB card (gemma-3-1b; DPO, KTO, GRPO,
RLOO, SFT on TRL 1.14.2 and 1.15.0), the longest length that trained in steps of 1,024 tokens. ``python
bench/gpu_predict.py validate`` simulates each at that length (it trained) and 1,024 tokens longer (it ran out):

* every run that ran out did so at a predicted allocated share of ``usable`` of at least 0.651 (DPO on 1.15.0):
  below :data:`FITS_BELOW` no published run ran out -> **fits**;
* every run that trained did so at a share of at most 0.915 (KTO on 1.14.2): above :data:`FAILS_ABOVE` no published
  run trained -> **does not fit**;
* in between some ran and some did not -> **uncertain**: measure the real peak with ``slimrl compare`` (or a short
  run) before renting the card for the whole run.

One rule for every card and trainer; the same two constants decide ``slimrl plan --budget/--gpu``, the planner's
searches (the fastest settings and the longest completion that *fit*) and ``slimrl_auto_fit``. The single share that
best reproduces the published *lengths* (where a run is most likely to stop) is :data:`LIKELY`, what ``validate``
uses for its length column. On a CPU the prediction is of resident memory, runtime included, with no allocator of
this kind (:mod:`slimrl.compat.runtime.malloc`): a run fits when its peak is within the budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from slimrl.compat.gpus import CUDA_CONTEXT_BYTES

FITS_BELOW = 0.65  # of usable memory: the lowest share at which a published run ran out (0.651), rounded down
FAILS_ABOVE = 0.92  # the highest share at which a published run still trained (0.915), rounded up
LIKELY = 0.82  # the one share (of 0.74-0.84, one for all ten runs) that reproduces most published lengths: 8 of 10

FITS, UNCERTAIN, DOES_NOT_FIT = "fits", "uncertain — measure with slimrl compare", "does not fit"


@dataclass(frozen=True)
class Verdict:
    """The answer for a predicted peak against a budget, and the numbers behind it (bytes)."""

    word: str  # FITS, UNCERTAIN or DOES_NOT_FIT
    allocated: int  # the predicted peak (CUDA: allocated bytes, the context not included)
    usable: int  # the budget less what the allocator never sees (CUDA: the context)
    device: str

    @property
    def fits(self) -> bool:
        return self.word == FITS

    def line(self) -> str:
        """One line for ``slimrl plan``: the verdict and the margin it has."""
        gib = 2**30
        if self.device != "cuda":
            room = (self.usable - self.allocated) / gib
            spare = f"{room:.2f} GiB to spare" if room >= 0 else f"{-room:.2f} GiB over"
            return f"{self.word}: predicted peak {self.allocated / gib:.2f} of {self.usable / gib:.2f} GiB ({spare})"
        share = self.allocated / self.usable if self.usable > 0 else float("inf")
        edge = {
            FITS: f"{(FITS_BELOW * self.usable - self.allocated) / gib:.2f} GiB below the {FITS_BELOW:.0%} "
            f"line, under which every published run fitted",
            UNCERTAIN: f"between {FITS_BELOW:.0%} and {FAILS_ABOVE:.0%}, where published runs both fitted and ran out",
            DOES_NOT_FIT: f"above {FAILS_ABOVE:.0%}, where no published run fitted",
        }[self.word]
        return (
            f"{self.word}: predicted max_memory_allocated {self.allocated / gib:.2f} GiB = {share:.0%} of "
            f"{self.usable / gib:.2f} GiB usable (the budget less {CUDA_CONTEXT_BYTES / gib:.1f} GiB of CUDA "
            f"context); {edge}"
        )


def usable_bytes(budget: int, device: str) -> int:
    """What the allocator can be asked for out of ``budget`` bytes (module docstring)."""
    return budget - CUDA_CONTEXT_BYTES if device == "cuda" else budget


def fitting_bytes(budget: int, device: str) -> int:
    """The largest predicted peak whose verdict is "fits": what the planner's searches and auto-fit aim under."""
    usable = usable_bytes(budget, device)
    return int(FITS_BELOW * usable) if device == "cuda" else usable


def verdict(allocated: int, budget: int, device: str) -> Verdict:
    """The verdict for a predicted peak of ``allocated`` bytes on a budget of ``budget`` bytes (module docstring)."""
    usable = usable_bytes(budget, device)
    if device != "cuda":
        return Verdict(FITS if allocated <= usable else DOES_NOT_FIT, allocated, usable, device)
    share = allocated / usable if usable > 0 else float("inf")
    word = FITS if share <= FITS_BELOW else DOES_NOT_FIT if share > FAILS_ABOVE else UNCERTAIN
    return Verdict(word, allocated, usable, device)
