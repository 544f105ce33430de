"""The reward sandbox's data: the limits of one call, the typed failures and the result (``run_sandboxed`` in
:mod:`slimrl.rewards.process_sandbox` never raises them: it returns them in a :class:`SandboxResult`)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one sandboxed call may use: ``wall_s`` seconds of real time, ``cpu_s`` of CPU time, ``memory_mb`` of
    address space, files up to ``file_mb``, ``disk_mb`` of scratch in all (kernel isolation: a tmpfs of that size),
    ``open_files`` descriptors, ``output_kb`` of stdout/stderr kept, ``result_kb`` of answer read."""

    wall_s: float = 5.0
    cpu_s: float = 5.0
    memory_mb: int = 512
    file_mb: int = 16
    disk_mb: int = 64
    open_files: int = 64
    output_kb: int = 64
    result_kb: int = 1024

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"Limits({field.name}={value!r}): pass a positive, finite number")
            if field.type in (int, "int") and value != int(value):
                raise ValueError(
                    f"Limits({field.name}={value!r}): a whole number of "
                    f"{field.name.rsplit('_', 1)[-1].replace('mb', 'MB').replace('kb', 'kB')}, e.g. "
                    f"{max(1, round(value))}"
                )
            if field.type in (int, "int"):
                object.__setattr__(self, field.name, int(value))
        if self.open_files < 16:  # the interpreter, its pipes and the modules it opens take about ten
            raise ValueError(
                f"Limits(open_files={self.open_files}): Python itself needs about 10 descriptors; pass >= 16"
            )
        if self.memory_mb < 64:
            raise ValueError(f"Limits(memory_mb={self.memory_mb}): Python itself needs about 64 MB; pass >= 64")


class SandboxError(Exception):
    """Why a sandboxed call gave no value (a subclass says which); ``str()`` is the detail."""

    kind = "failure"


class TimeLimitError(SandboxError, TimeoutError):
    """The wall-clock or CPU-time limit was reached (a ``TimeoutError`` too, as Unsloth's helpers raise)."""

    kind = "timeout"


class MemoryLimitError(SandboxError):
    """The memory limit was reached."""

    kind = "memory"


class ForbiddenError(SandboxError):
    """The code did something the sandbox refuses (a process, a socket, a file outside the scratch directory, a
    signal, ctypes ...): the process was ended at that point."""

    kind = "forbidden"


class DisallowedImportError(SandboxError):
    """The code imports a module outside the allow-list (found before it ran, or when it tried)."""

    kind = "import"


class RaisedError(SandboxError):
    """The code raised an exception (or does not define the function to call); ``error_type`` names it."""

    kind = "error"

    def __init__(self, message: str, error_type: str = "Exception"):
        super().__init__(message)
        self.error_type = error_type


class CrashedError(SandboxError):
    """The process ended without an answer (a signal, ``os._exit``, an interpreter crash)."""

    kind = "crashed"


class BadResultError(SandboxError):
    """The function returned something that is not JSON data, or an answer too large, too deep or malformed."""

    kind = "result"


class IsolationError(SandboxError):
    """The kernel does not give the isolation asked for (``str()`` names what is missing and how to allow it): no
    code ran. ``run_sandboxed(..., isolation="none")`` runs without it, by the caller's explicit choice."""

    kind = "isolation"


BY_KIND = {
    cls.kind: cls
    for cls in (
        TimeLimitError,
        MemoryLimitError,
        ForbiddenError,
        DisallowedImportError,
        RaisedError,
        BadResultError,
        IsolationError,
    )
}


@dataclasses.dataclass
class SandboxResult:
    """One sandboxed call: ``value`` (JSON data) when ``ok``, else ``failure``; the call's stdout/stderr (at most
    ``Limits.output_kb`` each), its wall time and the isolation layers that took effect."""

    value: Any = None
    failure: SandboxError | None = None
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0
    isolation: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.failure is None

    def unwrap(self) -> Any:
        """The value, or the failure raised."""
        if self.failure is not None:
            raise self.failure
        return self.value
