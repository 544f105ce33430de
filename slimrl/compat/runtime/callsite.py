"""Where a message should point: the user's own line, not slimrl's or a library's.

* :func:`warn` issues a warning attributed to the first frame outside slimrl, the standard library and installed
  packages (TRL, transformers, accelerate, ...) — the line of the user's script that led to it. Python 3.11 has no
  ``skip_file_prefixes``, and a fixed ``stacklevel`` lands on ``sys:1`` or on TRL's code when the call comes through
  a patched method.
* :func:`warnings_at_user_line`: a warning that TRL or transformers attributes to slimrl's own frame (their
  ``stacklevel=2`` from a constructor lands on slimrl's wrapper around it) is issued again at the user's line.
* :func:`install_one_line_errors` makes an uncaught error that slimrl raised on purpose (a ``raise`` statement in
  slimrl's code: bad input, something this machine cannot run) print as one line naming the error and the user's
  line, instead of a traceback through slimrl's internals. Everything else (errors in the user's code, TRL's, an
  accident in slimrl's) keeps Python's traceback, as does every error with ``SLIMRL_TRACEBACK=1``. Only the plain
  interpreter's hook is replaced: IPython/Jupyter and anything that installed its own keep theirs.
"""

from __future__ import annotations

import functools
import linecache
import os
import site
import sys
import sysconfig
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType, TracebackType

from slimrl.compat.runtime.env import env_flag

_PACKAGE = os.path.abspath(__file__)  # .../slimrl: up one folder per dot of this module's name
for _ in range(__name__.count(".")):
    _PACKAGE = os.path.dirname(_PACKAGE)


@functools.lru_cache(maxsize=1)
def _library_dirs() -> tuple[str, ...]:
    dirs = {_PACKAGE}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            dirs.add(path)
    try:
        dirs.update(site.getsitepackages())
        dirs.add(site.getusersitepackages())
    except AttributeError:  # virtualenv's old site module
        pass
    return tuple(os.path.abspath(d) + os.sep for d in dirs if d)


def is_library_file(filename: str) -> bool:
    """``filename`` belongs to slimrl, the standard library or an installed package (or is not a file)."""
    if not filename or filename.startswith("<"):
        return True
    path = os.path.abspath(filename)
    return any(path.startswith(d) for d in _library_dirs())


def user_frame(frame: FrameType | None) -> FrameType | None:
    """The first frame, walking outwards from ``frame``, that is the user's code (None when there is none)."""
    while frame is not None and is_library_file(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the user's line (module docstring); the caller's caller
    where the whole stack is library code (``python -m slimrl ...``)."""
    frame, level = sys._getframe(1), 2
    found = frame
    while found is not None and is_library_file(found.f_code.co_filename):
        found, level = found.f_back, level + 1
    warnings.warn(message, category, stacklevel=level if found is not None else 3)


def _in_slimrl(filename: str) -> bool:
    return bool(filename) and os.path.abspath(filename).startswith(_PACKAGE + os.sep)


@contextmanager
def warnings_at_user_line() -> Iterator[None]:
    """Inside the block, a warning attributed to one of slimrl's files is issued again at the user's line (module
    docstring), through the user's filters there: shown once per user line under the default filter, raised in
    place under an ``error`` filter. Every other warning is shown as it would have been."""
    previous = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        frame = user_frame(sys._getframe(1)) if _in_slimrl(filename) and file is None else None
        if frame is None:
            return previous(message, category, filename, lineno, file, line)
        globs = frame.f_globals
        warnings.warn_explicit(
            message,
            category,
            frame.f_code.co_filename,
            frame.f_lineno,
            module=globs.get("__name__"),
            registry=globs.setdefault("__warningregistry__", {}),
            module_globals=globs,
        )

    with warnings.catch_warnings():
        # slimrl's own module registries must not swallow a repeat: the user's line decides what is shown
        warnings.filterwarnings("always", module=r"slimrl(\.|$)")
        warnings.showwarning = show
        yield


def _raised_by_slimrl(tb: TracebackType | None) -> tuple[str, int] | None:
    """(file, line) of the ``raise`` statement in slimrl's code that raised, else None."""
    last = tb
    while last is not None and last.tb_next is not None:
        last = last.tb_next
    if last is None:
        return None
    filename, line = last.tb_frame.f_code.co_filename, last.tb_lineno
    if not os.path.abspath(filename).startswith(_PACKAGE + os.sep):
        return None
    return (filename, line) if linecache.getline(filename, line).strip().startswith("raise") else None


def _user_line(tb: TracebackType | None) -> str:
    """``file:line: source`` of the innermost user frame in ``tb``."""
    found = None
    while tb is not None:
        if not is_library_file(tb.tb_frame.f_code.co_filename):
            found = tb
        tb = tb.tb_next
    if found is None:
        return ""
    filename, line = found.tb_frame.f_code.co_filename, found.tb_lineno
    return f"{filename}:{line}: {linecache.getline(filename, line).strip()}"


def one_line_error_hook(
    exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None, previous=None
) -> None:
    """The hook :func:`install_one_line_errors` installs (module docstring)."""
    previous = previous or sys.__excepthook__
    own = _raised_by_slimrl(tb)
    cause = exc.__cause__
    from_user = cause is not None and _raised_by_slimrl(cause.__traceback__) is None
    if own is None or from_user or not issubclass(exc_type, Exception) or env_flag("SLIMRL_TRACEBACK"):
        previous(exc_type, exc, tb)
        return
    where = _user_line(tb)
    print(f"slimrl: {exc_type.__name__}: {exc}", file=sys.stderr)
    print(
        f"  at {where}" if where else "  (raised inside slimrl)",
        "  [SLIMRL_TRACEBACK=1 shows the traceback]",
        file=sys.stderr,
        flush=True,
    )


def install_one_line_errors() -> None:
    """Put :func:`one_line_error_hook` in front of the interpreter's default ``sys.excepthook`` (once)."""
    if sys.excepthook is not sys.__excepthook__:
        return  # IPython, a debugger, or a hook the user installed: theirs stays
    sys.excepthook = functools.partial(one_line_error_hook, previous=sys.__excepthook__)
