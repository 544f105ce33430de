"""One device -> host read for several tensors; host lists to a CUDA device without the pageable copy's sync."""

from __future__ import annotations

import torch

from slimrl.compat import host_transfer
from slimrl.compat.host_transfer import move, read_together, to_device


def test_read_together_gives_each_tensors_tolist():
    a = torch.tensor([3, 0, 7])
    b = torch.tensor([[1, 2], [3, 4], [5, 6]], dtype=torch.int32)
    c = torch.tensor([True, False, True])
    got = read_together([a, b, c])
    assert got == [a.tolist(), b.tolist(), [1, 0, 1]]


def test_read_together_is_one_host_read(monkeypatch):
    reads = []
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(t.shape) or real(t))
    read_together([torch.arange(4), torch.zeros(4, 3, dtype=torch.long), torch.ones(4, dtype=torch.bool)])
    assert reads == [torch.Size([20])]


def test_to_device_on_cuda_is_queued_from_pinned_memory(monkeypatch):
    """The copy to a CUDA device goes from pinned memory with non_blocking (queued, no stream sync); where pinning
    is refused once, every later copy goes through pageable memory without trying again."""
    calls = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t: calls.append("pin") or t)
    monkeypatch.setattr(torch.Tensor, "to", lambda t, device, non_blocking=False: calls.append(non_blocking) or t)
    monkeypatch.setitem(host_transfer._PINNING, "refused", False)
    cuda = torch.device("cuda", 0)
    assert to_device([4, 5], cuda).tolist() == [4, 5]
    assert calls == ["pin", True]

    def refuse(t):
        calls.append("refused")
        raise RuntimeError("cudaHostAlloc: out of locked memory")

    calls.clear()
    monkeypatch.setattr(torch.Tensor, "pin_memory", refuse)
    move(torch.arange(3), cuda)
    move(torch.arange(3), cuda)
    assert calls == ["refused", False, False]


def test_to_device_on_cpu_is_the_plain_tensor():
    t = to_device([1, 2, 3], torch.device("cpu"), dtype=torch.int32)
    assert t.dtype == torch.int32 and t.tolist() == [1, 2, 3]
