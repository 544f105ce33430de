"""Offloaded checkpointing's CUDA protocol and its host memory, run on this CPU: a recording stand-in for
:class:`slimrl.models.offload.CudaCopies` logs each stream/event call in order (the values still copied, so the
gradients are checked too), and the pool of host buffers is reused from step to step and bounded."""

from __future__ import annotations

import pytest
import torch

from slimrl.compat.page_lock import PageLock
from slimrl.models import offload
from tests.tiny import tiny_llama


class Recording(offload.HostCopies):
    """What ``CudaCopies`` does, as a log: ``out`` = side stream waits for compute, copy, record_stream(side);
    ``back`` = copy on the side stream, record event; ``use`` = compute waits on that event, record_stream(compute)."""

    def __init__(self):
        self.log, self.pinned, self.freed = [], 0, 0

    def new_buffer(self, nbytes, pin):
        self.pinned += nbytes if pin else 0
        return torch.empty(nbytes, dtype=torch.uint8), pin

    def free_buffer(self, buf, pinned):
        self.freed += buf.numel()

    def out(self, host, t):
        self.log += [("side.wait_stream", "compute"), ("copy_out", id(host)), ("record_stream", "side")]
        host.copy_(t)

    def back(self, host, device):
        event = ("event", id(host))
        self.log += [("copy_back", id(host)), ("record_event", event)]
        return host.clone(), event

    def use(self, t, ready):
        self.log += [("compute.wait_event", ready), ("record_stream", "compute")]


def _step(model, offloader, rows=3, tokens=21):
    ids = torch.randint(0, 49, (rows, tokens), generator=torch.Generator().manual_seed(rows * tokens))
    with offloader.hooks():
        h = model.model.embed_tokens(ids)
        for layer in model.model.layers:  # each layer's input saved through the hooks, as checkpointing does
            h = layer.mlp(h) + h
    h.sum().backward()


def test_the_stream_protocol_in_order(monkeypatch):
    monkeypatch.setattr(offload, "MIN_BYTES", 0)
    model = tiny_llama(seed=0)
    copies = Recording()
    offloader = offload.Offloader(copies, cap=1 << 30)
    _step(model, offloader)
    log = copies.log
    outs = [i for i, e in enumerate(log) if e[0] == "copy_out"]
    backs = [i for i, e in enumerate(log) if e[0] == "copy_back"]
    assert outs and len(backs) == len(outs), "every packed tensor is fetched back once"
    for i in outs:
        assert log[i - 1] == ("side.wait_stream", "compute") and log[i + 1] == ("record_stream", "side")
    assert max(outs) < min(backs), "the backward fetches after the forward packed"
    for i in backs:
        assert log[i + 1][0] == "record_event"
        waits = [j for j, e in enumerate(log) if e == ("compute.wait_event", log[i + 1][1])]
        assert len(waits) == 1 and waits[0] > i and log[waits[0] + 1] == ("record_stream", "compute")
    # one layer of look-ahead: the second fetch starts before the compute stream waits on the first
    first_wait = next(j for j, e in enumerate(log) if e[0] == "compute.wait_event")
    assert len([i for i in backs if i < first_wait]) == 2
    assert offloader.fetched_ahead >= 1


def test_gradients_equal_no_offload(monkeypatch):
    monkeypatch.setattr(offload, "MIN_BYTES", 0)
    grads = []
    for copies in (None, Recording()):
        model = tiny_llama(seed=0)
        if copies is None:
            ids = torch.randint(0, 49, (3, 21), generator=torch.Generator().manual_seed(63))
            h = model.model.embed_tokens(ids)
            for layer in model.model.layers:
                h = layer.mlp(h) + h
            h.sum().backward()
        else:
            _step(model, offload.Offloader(copies, cap=1 << 30))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    assert all(torch.equal(grads[0][n], grads[1][n]) for n in grads[0])


def test_buffers_are_reused_across_steps(monkeypatch):
    """PyTorch's pinned allocator rounds each request to a power of two and caches it for good; slimrl's pool makes
    its buffers once and hands them out again at the next step (a slightly shorter one too)."""
    monkeypatch.setattr(offload, "MIN_BYTES", 0)
    model = tiny_llama(seed=0)
    copies = Recording()
    offloader = offload.Offloader(copies, cap=1 << 30)
    _step(model, offloader, tokens=21)
    made, pinned = offloader.pool.created, copies.pinned
    for tokens in (21, 20, 21):
        _step(model, offloader, tokens=tokens)
    assert offloader.pool.created == made and copies.pinned == pinned
    assert all(b.numel() % offload.GRANULE == 0 for b, _ in offloader.pool.free)


def test_pinned_memory_is_bounded(monkeypatch):
    monkeypatch.setattr(offload, "MIN_BYTES", 0)
    model = tiny_llama(seed=0)
    copies = Recording()
    offloader = offload.Offloader(copies, cap=2 * offload.GRANULE)  # room for two buffers
    with pytest.warns(UserWarning, match="layer inputs of this step need more than 0.00 GiB of pinned host memory"):
        _step(model, offloader)
    assert offloader.pool.pinned_bytes == copies.pinned <= 2 * offload.GRANULE
    assert offloader.pool.created > 2  # the rest went to pageable memory
    offloader.pool.clear()
    assert offloader.pool.pinned_bytes == 0 and not offloader.pool.free


def test_a_refused_page_lock_is_said_once_and_not_retried(monkeypatch, caplog):
    """``cudaHostRegister`` refused (a VM, a locked-memory limit): one line names it and the fix, the buffer is used
    unpinned, and later buffers do not ask again (each refusal is a driver call)."""
    import warnings
    from types import SimpleNamespace

    calls = []

    def register(ptr, nbytes, flags):
        calls.append(nbytes)
        return 1  # cudaErrorInvalidValue

    monkeypatch.setattr(torch.cuda, "cudart", lambda: SimpleNamespace(cudaHostRegister=register))
    copies = offload.CudaCopies.__new__(offload.CudaCopies)  # no stream needed to make buffers
    copies.lock_error, copies.registered = None, set()
    copies.lock = PageLock(register_error=None, allocates=False, copies_async=True)  # the probe's buffer registered
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        first = copies.new_buffer(1 << 20, pin=True)
        second = copies.new_buffer(1 << 20, pin=True)
    said = [str(w.message) for w in seen] + [r.getMessage() for r in caplog.records]
    assert first[1] is False and second[1] is False and calls == [1 << 20]
    assert sum("cudaHostRegister error 1" in m and "use_gradient_checkpointing=True" in m for m in said) == 1, said


def test_where_registration_is_refused_the_pool_pins_by_allocation(monkeypatch):
    """The probe found ``cudaHostRegister`` refused but pinned allocation working: buffers come from torch's pinned
    allocator (pinned, so the copies overlap), never registered, and dropping one unregisters nothing."""
    from types import SimpleNamespace

    made, unregistered = [], []
    real_empty = torch.empty

    def empty(*args, pin_memory=False, **kwargs):
        made.append(pin_memory)
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: SimpleNamespace(cudaHostUnregister=unregistered.append))
    copies = offload.CudaCopies.__new__(offload.CudaCopies)
    copies.lock_error, copies.registered = None, set()
    copies.lock = PageLock(register_error=1, allocates=True, copies_async=True)
    copies.stream = SimpleNamespace(synchronize=lambda: None)
    buf, pinned = copies.new_buffer(1 << 20, pin=True)
    assert pinned and made == [True]
    copies.free_buffer(buf, pinned)
    assert unregistered == []
    assert copies.new_buffer(1 << 20, pin=False)[1] is False and made == [True, False]  # over the pool's cap
