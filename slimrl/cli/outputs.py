"""``--output_dir`` of ``slimrl train``: writable, one run at a time, nothing of an earlier run replaced silently,
and ``--resume`` only from a checkpoint that loads and matches the run.

* :func:`check_output_dir`: not a file, not under a file, writable (checked by writing).
* :func:`run_lock`: ``.slimrl.lock`` (pid, host, start time) while a run is alive; a second run on the directory
  stops with one line; a lock whose process is gone (``kill -9``) is taken over with a warning.
* :func:`refuse_earlier_run`: checkpoints or an adapter already there need ``--resume`` or
  ``--overwrite_output_dir true`` (which then clears them before training, so the directory never mixes runs).
* :func:`pick_checkpoint`: ``--resume``'s checkpoint after checking every file loads (JSON, safetensors,
  torch zip archives); a damaged newest one is named and skipped for the newest intact one. The run it belongs
  to (``slimrl_run.json``: algorithm, LoRA rank, target modules) must match this one.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from slimrl.compat.runtime.callsite import warn
from slimrl.compat.runtime.processes import pid_alive
from slimrl.errors import InputError

LOCK = ".slimrl.lock"
RUN_FILE = "slimrl_run.json"  # written into every checkpoint: what a resume must match
RUN_OUTPUTS = ("adapter", "metrics.jsonl", "metrics.csv", "metrics.png", "slimrl-error.log")


def check_output_dir(path: str) -> Path:
    """``path`` can hold the run's files: InputError naming the problem otherwise."""
    if not isinstance(path, str) or "\0" in path:
        raise InputError(f"--output_dir {path!r}: pass a directory path (a string without NUL characters)")
    out = Path(path).expanduser()
    longest = max((len(part.encode()) for part in out.parts), default=0)
    if longest > 255 or len(str(out).encode()) >= 4096:  # NAME_MAX / PATH_MAX on Linux filesystems
        raise InputError(
            f"--output_dir {path[:60]}...: too long for the filesystem (a name of at most 255 bytes, a "
            f"path under 4096); pass a shorter directory"
        )
    if out.exists() and not out.is_dir():
        raise InputError(f"--output_dir {path}: is a file; pass a directory (it is created if missing)")
    for parent in out.parents:
        if parent.exists():
            if not parent.is_dir():
                raise InputError(
                    f"--output_dir {path}: {parent} is a file, so nothing can be created under it; "
                    f"pass another directory"
                )
            break
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".slimrl-write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise InputError(
            f"--output_dir {path}: cannot write there ({err.strerror or err}); pass a writable directory"
        ) from None
    return out


@contextmanager
def run_lock(out: Path) -> Iterator[None]:
    """Hold ``out/.slimrl.lock`` for the run (see the module docstring)."""
    lock = out / LOCK
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                held = json.loads(lock.read_text())
            except (OSError, ValueError):
                held = {}
            pid, host = held.get("pid"), held.get("host")
            if isinstance(pid, int) and host == me["host"] and not pid_alive(pid):
                warn(
                    f"{lock}: the run that held it (pid {pid}, started {held.get('started')}) is gone; "
                    f"taking the directory over",
                    UserWarning,
                )
                lock.unlink(missing_ok=True)
                continue
            who = f"pid {pid} on {host}" if pid else "another process"
            raise InputError(
                f"--output_dir {out}: another slimrl train ({who}, started {held.get('started', '?')})"
                f" is writing there; wait for it, pick another --output_dir, or delete {lock} if that "
                f"run is gone"
            ) from None
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        break
    try:
        yield
    finally:
        try:
            if json.loads(lock.read_text()).get("pid") == me["pid"]:
                lock.unlink()
        except (OSError, ValueError):
            pass


def checkpoints(out: Path) -> list[Path]:
    """``checkpoint-N`` directories of ``out``, newest first."""
    found = [p for p in out.glob("checkpoint-*") if p.is_dir() and p.name.split("-")[-1].isdigit()]
    return sorted(found, key=lambda p: int(p.name.split("-")[-1]), reverse=True)


def refuse_earlier_run(out: Path, resume: bool, overwrite: bool) -> None:
    """An earlier run's checkpoints/adapter need ``--resume`` or ``--overwrite_output_dir true`` (then cleared)."""
    earlier = [p.name for p in checkpoints(out)] + [n for n in ("adapter",) if (out / n).exists()]
    if not earlier or resume:
        return
    if overwrite:
        for ckpt in checkpoints(out):
            shutil.rmtree(ckpt)
        for name in RUN_OUTPUTS:
            target = out / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
        return
    shown = ", ".join(sorted(earlier)[:3]) + (" ..." if len(earlier) > 3 else "")
    raise InputError(
        f"--output_dir {out} already holds an earlier run ({shown}): continue it with --resume, or "
        f"pass --overwrite_output_dir true to replace it"
    )


def damaged_file(ckpt: Path) -> str | None:
    """The first file of ``ckpt`` that does not load (JSON, safetensors, torch zip archive), or None."""
    from safetensors import safe_open

    if not (ckpt / "trainer_state.json").is_file():
        return "trainer_state.json (missing)"
    for path in sorted(ckpt.rglob("*")):  # the reference adapter of a checkpoint lives in ref/
        if not path.is_file():
            continue
        name = str(path.relative_to(ckpt))
        try:
            if path.suffix == ".json":
                _check_json(path)
            elif path.suffix == ".safetensors":
                with safe_open(str(path), framework="pt") as f:
                    for key in f.keys():
                        tensor = f.get_slice(key)[:]  # every tensor's bytes are there
                        if (
                            path.name.startswith("adapter_model")
                            and tensor.is_floating_point()
                            and not bool(tensor.isfinite().all())
                        ):
                            raise ValueError(f"{key} holds NaN or inf")
            elif path.suffix in (".pt", ".pth", ".bin"):
                with zipfile.ZipFile(path) as archive:
                    if archive.testzip() is not None:
                        raise zipfile.BadZipFile("CRC mismatch")
                if path.name not in NOT_LOADED_ON_RESUME:
                    _check_shape(path.name, _check_pickle(path))
        except Exception as err:  # noqa: BLE001  (any failure to load is damage)
            return f"{name} ({type(err).__name__}: {str(err)[:80]})" if str(err) else f"{name} ({type(err).__name__})"
    return None


MAX_STEP = 10**12  # a step count beyond any run


def _check_shape(name: str, data: Any) -> None:
    """What the trainer reads from the archive is there, of the kind it reads: the optimizer's ``state`` and
    ``param_groups``, a scheduler's mapping, the RNG states (each set on a fresh generator, not the global ones)."""
    if name == "optimizer.pt":
        if (
            not isinstance(data, dict)
            or not isinstance(data.get("state"), dict)
            or not isinstance(data.get("param_groups"), list)
        ):
            raise TypeError("not an optimizer state (state, param_groups)")
        groups = data["param_groups"]
        # a group may be empty (the Trainer's no-decay group under LoRA), the list of groups may not
        if not groups or not all(
            isinstance(g, dict)
            and isinstance(g.get("params"), list)
            and all(isinstance(i, int) and not isinstance(i, bool) for i in g["params"])
            for g in groups
        ):
            raise TypeError("it has no parameter groups, or a group holds something other than parameter ids")
    elif name == "scheduler.pt":
        if not isinstance(data, dict):
            raise TypeError("not a scheduler state (a mapping)")
        kinds = {"last_epoch": int, "_step_count": int, "base_lrs": list, "_last_lr": list}
        for key, kind in kinds.items():
            value = data.get(key)
            if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
                raise TypeError(f"its {key} is a {type(value).__name__}, not a {kind.__name__}")
            if kind is list and value is not None and not all(isinstance(x, int | float) for x in value):
                raise TypeError(f"its {key} holds something other than learning rates")
    elif name.startswith("rng_state"):
        import random

        import numpy as np
        import torch

        if not isinstance(data, dict):
            raise TypeError("not the RNG states (a mapping)")
        random.Random().setstate(data["python"])
        np.random.RandomState().set_state(data["numpy"])
        torch.Generator().set_state(data["cpu"])


# archives a resume never opens: the trainer's pickled config is written for the record only (transformers reads
# the arguments of the new run), so it is checked as an archive, not loaded
NOT_LOADED_ON_RESUME = {"training_args.bin"}

# the fields a resume reads from each JSON file of a checkpoint, with their types
JSON_FIELDS = {
    "trainer_state.json": {"global_step": int, "log_history": list},
    "adapter_config.json": {"r": int},
    RUN_FILE: {"algorithm": str, "lora_r": int, "model": str},
}


def _check_json(path: Path) -> None:
    """A JSON file of a checkpoint: valid, a mapping, and the fields a resume reads of the types it reads them as;
    ``trainer_state.json`` only with the keys transformers' TrainerState takes, a step in [0, 10**12] and a log of
    mappings; an adapter config's ``target_modules`` a name or a list of names."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise TypeError(f"{path.name} holds a {type(data).__name__}, not a mapping")
    for key, kind in JSON_FIELDS.get(path.name, {}).items():
        if key in data and data[key] is not None and (not isinstance(data[key], kind) or isinstance(data[key], bool)):
            raise TypeError(f"{path.name}: {key} is a {type(data[key]).__name__}, not a {kind.__name__}")
    if path.name == "trainer_state.json":
        import dataclasses

        from transformers import TrainerState

        unknown = set(data) - {f.name for f in dataclasses.fields(TrainerState)}
        if unknown:
            raise TypeError(f"unknown key {sorted(unknown)[0]!r}")
        if not 0 <= data.get("global_step", 0) <= MAX_STEP:
            raise ValueError(f"global_step {data['global_step']} is not a step count")
        if not all(isinstance(row, dict) for row in data.get("log_history") or []):
            raise TypeError("log_history holds a non-mapping")
    if path.name == "adapter_config.json":
        modules = data.get("target_modules")
        if modules is not None and not (
            isinstance(modules, str) or (isinstance(modules, list) and all(isinstance(m, str) for m in modules))
        ):
            raise TypeError(f"target_modules is {modules!r}, not module names")
        if "r" in data and isinstance(data["r"], int) and data["r"] < 1:
            raise ValueError(f"r {data['r']} is not a rank")


def _check_pickle(path: Path) -> Any:
    """A torch archive loads with ``weights_only=True`` (tensors and plain data; numpy arrays as transformers allows
    them in its RNG states): a pickle that would run code is refused here, before the trainer opens it."""
    import torch
    from transformers.trainer_pt_utils import safe_globals

    with safe_globals():
        return torch.load(path, map_location="cpu", weights_only=True)


def pick_checkpoint(resume: str, out: Path) -> Path:
    """The checkpoint ``--resume`` continues from (see the module docstring)."""
    if resume != "latest":
        ckpt = Path(resume).expanduser()
        if not ckpt.is_dir():
            raise InputError(f"--resume {resume}: no such checkpoint directory")
        bad = damaged_file(ckpt)
        if bad:
            raise InputError(f"--resume {resume}: {bad} is damaged; pass an intact checkpoint or --resume latest")
        return ckpt
    for ckpt in checkpoints(out):
        bad = damaged_file(ckpt)
        if bad is None:
            return ckpt
        warn(f"--resume: {ckpt.name} is damaged ({bad} does not load); trying an older checkpoint", UserWarning)
    raise InputError(f"--resume: no intact checkpoint in {out}; run without --resume to start over")


def run_record(algorithm: str, lora_r: int, model: str) -> dict[str, Any]:
    return {"algorithm": algorithm, "lora_r": lora_r, "model": model}


class RunRecordCallback(TrainerCallback):
    """Writes :data:`RUN_FILE` into every checkpoint (what a later ``--resume`` is checked against)."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record

    def on_save(self, args, state, control, **kwargs):
        ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero and ckpt.is_dir():
            (ckpt / RUN_FILE).write_text(json.dumps(self.record))
