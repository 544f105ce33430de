"""The parity tests' summation order must not depend on the machine: slimrl's automatic chunking reads free memory
(:func:`slimrl.ops.chunked_logprob.auto_chunk_rows`), so under load or beside another worker a test would split its
rows differently from one run to the next. Here free memory reads as a fixed 16 GiB (a test about the automatic
chunking sets its own)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _fixed_free_memory(monkeypatch):
    import slimrl.ops.chunked_logprob as op

    monkeypatch.setattr(op, "free_bytes", lambda device: 16 * 2**30)
