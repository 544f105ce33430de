"""Host synchronisations in GRPO's ``training_step``: slimrl against TRL alone, counted in the same test.

On CUDA each of these waits for the GPU's queue to drain, and the GPU then idles while the host launches what comes
next: ``Tensor.item``/``tolist``/``cpu``, a tensor's ``bool``/``int``/``float``, ``torch.cuda.synchronize``, and
``torch.tensor(values, device=...)`` (a copy from pageable host memory ends in a stream synchronisation). Each is
counted inside ``training_step`` (which in GRPO includes generation) for two steps of
``tests.patching.trainers.test_grpo.run_grpo`` (beta 0.04, ``num_iterations=2``: per generation an old-policy and a
reference pass, then two loss micro-steps), with an H100 presented through torch's CUDA API (the tensors stay on
the CPU: what is counted is what the code asks of the device).

Measured here (TRL 1.16): TRL alone 72 syncs; slimrl 133 before its row facts were read once per call, 75 now. The
three it still adds, by site: one read of a log-prob call's row facts (:mod:`slimrl.patching.routes.call_rows`)
for each loss micro-step plus one that the old-policy and reference calls share, one for the non-finite check after
each backward, and one for the shared prefill's distinct prompts per generation, less the three per-forward mask
checks of transformers that the shared-prefix layout's 4-D mask spares.
"""

from __future__ import annotations

import collections
import traceback
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

from slimrl import PatchFastRL, unpatch

SYNCS = {
    torch.Tensor.item: "item",
    torch.Tensor.tolist: "tolist",
    torch.Tensor.cpu: "cpu",
    torch.Tensor.__bool__: "bool",
    torch.Tensor.__int__: "int",
    torch.Tensor.__float__: "float",
}
SLIMRL = str(Path(__import__("slimrl").__file__).parent)
# the syncs slimrl adds, by the slimrl module that asks: at most this many in the two steps (module docstring)
ADDED = {"call_rows.py": 3, "nonfinite.py": 2, "shared_prefill.py": 1}
NET = 3  # slimrl's count less TRL's: ADDED less the three mask checks the 4-D mask spares


class Syncs(TorchFunctionMode):
    """Counts host syncs, and for each the slimrl module that asks (None: TRL's or transformers' code asks; through
    :mod:`slimrl.compat.host_transfer`, its caller asks)."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0
        self.by_module: collections.Counter = collections.Counter()

    def hit(self) -> None:
        self.total += 1
        stack = [f.filename for f in traceback.extract_stack()[:-2] if not f.filename.endswith("host_transfer.py")]
        here = stack[-1] if stack[-1].startswith(SLIMRL) else None
        self.by_module[Path(here).name if here else None] += 1

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in SYNCS:
            self.hit()
        return func(*args, **(kwargs or {}))


def _count(tmp_path: Path, monkeypatch, patched: bool) -> Syncs:
    from trl import GRPOTrainer

    from tests.patching.trainers.test_grpo import run_grpo

    syncs = Syncs()
    tensor = torch.tensor

    def counted_tensor(*args, **kwargs):
        if kwargs.get("device") is not None and syncs.is_active:
            syncs.hit()
        return tensor(*args, **kwargs)

    def counted_synchronize(*args, **kwargs):
        syncs.hit()

    real_step = GRPOTrainer.training_step

    def step(self, *args, **kwargs):
        syncs.is_active = True
        try:
            with syncs:
                return type(self).training_step_counted(self, *args, **kwargs)
        finally:
            syncs.is_active = False

    syncs.is_active = False
    if patched:
        PatchFastRL("grpo")
    try:
        with monkeypatch.context() as m:
            m.setattr(torch, "tensor", counted_tensor)
            m.setattr(torch.cuda, "synchronize", counted_synchronize)
            m.setattr(GRPOTrainer, "training_step_counted", GRPOTrainer.training_step, raising=False)
            m.setattr(GRPOTrainer, "training_step", step)
            run_grpo(tmp_path, "grpo", 0.04)
    finally:
        if patched:
            unpatch()
    assert GRPOTrainer.training_step is real_step
    return syncs


@pytest.fixture
def presented_h100(fake_gpu):
    fake_gpu("h100")


def test_grpo_step_adds_only_the_stated_syncs(tmp_path, monkeypatch, presented_h100):
    trl = _count(tmp_path / "trl", monkeypatch, patched=False)
    ours = _count(tmp_path / "slimrl", monkeypatch, patched=True)
    added = {m: n for m, n in ours.by_module.items() if m in ADDED}
    assert all(n <= ADDED[m] for m, n in added.items()), added
    replacing = sum(n for m, n in ours.by_module.items() if m is not None and m not in ADDED)
    # where slimrl's code stands in for TRL's (its old-log-prob and prefill paths), it asks no more than TRL did
    assert ours.by_module[None] + replacing <= trl.total, (dict(ours.by_module), trl.total)
    assert ours.total - trl.total <= NET, (ours.total, trl.total, dict(ours.by_module))
