"""slimrl's default for the settings that buy memory with time: priced by the planner in seconds per GiB saved.

Two settings lower the peak at a cost in step time:

* ``tiled_mlp`` (``unsloth_tiled_mlp``): under checkpointing, the backward's recompute runs each MLP a tile of tokens
  at a time (:mod:`slimrl.models.tiled_mlp`), for one more MLP forward per layer;
* ``offload`` (``use_gradient_checkpointing="slimrl"`` on CUDA): the checkpointed layer inputs live in host memory
  (:mod:`slimrl.models.offload`), two crossings of the host link per input, hidden behind the compute where host
  memory pins and copies run asynchronously (:mod:`slimrl.compat.page_lock`), synchronous where not.

Where the user left them to slimrl, a run starts with neither. While the predicted peak is above the aim (the
largest peak whose verdict is "fits" for the budget, :func:`slimrl.planning.verdict.fitting_bytes`), the lever
with the fewest predicted seconds per GiB saved is applied, then the next; a lever that saves nothing is never
applied. A lever that saves memory and is predicted to add no time at all (the offload where its copies hide
behind the compute) is applied whatever the budget: it trades no time. With no budget known nothing
else is applied; on a CPU neither lever exists (the plan has nothing to move).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from slimrl.planning.settings import Settings

GIB = 2**30

# each lever: the settings with it on (the settings given have it off)
LEVERS: dict[str, Callable[[Settings], Settings]] = {
    "tiled_mlp": lambda s: replace(s, tiled_mlp=True),
    "offload": lambda s: replace(s, gradient_checkpointing="slimrl"),
}


@dataclass(frozen=True)
class Priced:
    """One lever as the planner prices it: predicted peak bytes and step seconds without and with it."""

    lever: str
    peak: tuple[int, int]
    seconds: tuple[float, float]

    @property
    def seconds_per_gib(self) -> float:
        saved = (self.peak[0] - self.peak[1]) / GIB
        return (self.seconds[1] - self.seconds[0]) / saved if saved > 0 else float("inf")

    @property
    def free(self) -> bool:
        """It saves memory at no predicted cost (module docstring): applied whatever the budget."""
        return self.peak[1] < self.peak[0] and self.seconds[1] <= self.seconds[0]

    def why(self) -> str:
        """Why the default applied it."""
        return "it costs no predicted time" if self.free else "the peak without it is above what fits"

    def note(self) -> str:
        (a, b), (s0, s1) = self.peak, self.seconds
        return (
            f"{self.lever}: predicted peak {a / GIB:.2f} -> {b / GIB:.2f} GiB, step {s0:.3f} -> {s1:.3f} s "
            f"({self.seconds_per_gib:.3f} s per GiB saved)"
        )


def choose(
    settings: Settings, levers: tuple[str, ...], aim: int | None, predict: Callable[[Settings], tuple[int, float]]
) -> tuple[Settings, list[Priced], list[Priced]]:
    """(the settings chosen, the levers applied in order, the levers left off as last priced) for ``settings``
    with every lever of ``levers`` off; ``predict``: the planner's (peak bytes, step seconds) of a run's settings;
    ``aim``: the peak to get under (None: no budget known, nothing applied)."""
    current, (peak, seconds) = settings, predict(settings)
    applied: list[Priced] = []
    left = list(levers)
    priced: dict[str, Priced] = {}
    while left:
        priced = {}
        for lever in left:
            p, s = predict(LEVERS[lever](current))
            priced[lever] = Priced(lever, (peak, p), (seconds, s))
        useful = [p for p in priced.values() if p.peak[1] < p.peak[0]]
        free = [p for p in useful if p.free]
        if not free and (aim is None or peak <= aim):
            break
        if not useful:
            break
        best = min(free or useful, key=lambda p: p.seconds_per_gib)
        applied.append(best)
        current, peak, seconds = LEVERS[best.lever](current), best.peak[1], best.seconds[1]
        left.remove(best.lever)
    return current, applied, [priced[k] for k in left if k in priced]
