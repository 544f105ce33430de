"""The GPU benches' own logic on this CPU (their GPU figures come from a GPU machine, see docs/BENCHMARKS.md): the
linear fit of the longest completion under a cap, a probe over the cap, the carry sets' rebuilt wheels and the
Unsloth set's requirement check."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _bench(name: str):
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "points,expected",
    [
        ({1024: 10.0, 2048: 12.0}, 7680),  # 2 GB per 1k tokens: 1024 + (0.97 * 24 - 10) / 2 * 1024 = 7823, down to 256s
        ({1024: 20.0, 2048: 30.0}, 1280),  # 1024 + 3.28 / 10 * 1024 = 1359
        ({1024: 23.5, 2048: 30.0}, None),  # over the aimed 23.28 GB at the shorter length already
        ({1024: 5.0, 2048: 5.0}, 32768),  # no growth measured: the longest the fit may predict
    ],
)
def test_linear_fit_of_the_longest_length_under_the_cap(points, expected):
    gpu_grpo = _bench("gpu_grpo")
    assert gpu_grpo.linear_fit(points, 24.0, 0.97, 256, 32768) == expected


def test_a_probe_over_the_cap_does_not_fit(tmp_path, monkeypatch, capsys):
    """``--fit`` on this CPU: the two measured lengths give a fitted one, whose probe is over ``--cap-gb`` (a peak
    RSS above it), so the side's longest fit is None and the report says the probe failed."""
    monkeypatch.setattr(sys, "argv", ["gpu_grpo.py"])
    gpu_grpo = _bench("gpu_grpo")
    common = ["--device", "cpu", "--tiny", "--generations", "2", "--cache", str(tmp_path), "--prompt-length", "8"]
    out = gpu_grpo.main(
        common
        + [
            "--sides",
            "slimrl",
            "--fit",
            "--cap-gb",
            "0.1",
            "--fit-lengths",
            "8,16",
            "--fit-step",
            "8",
            "--fit-max",
            "64",
            "--fit-margin",
            "1e9",
        ]
    )  # aims over the cap
    side = out["slimrl"]
    assert side["predicted"] and side["longest_fit"] is None and side["confirmed"] is False
    assert side["probe"]["fits"] is False and side["probe"]["peak_gb"] > 0.1
    assert "probe does not fit: longest None" in capsys.readouterr().out


def _wheel(path: Path, files: dict[str, bytes], scripts: str = "") -> Path:
    gpu_wheels = _bench("gpu_wheels")
    record = [f"{n},{gpu_wheels._record_hash(d)},{len(d)}" for n, d in files.items()]
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("demo-1.0.dist-info/entry_points.txt", scripts)
        z.writestr("demo-1.0.dist-info/RECORD", "\n".join(record) + "\ndemo-1.0.dist-info/RECORD,,\n")
    return path


def test_a_rebuilt_wheel_drops_only_what_it_names_and_stays_installable(tmp_path):
    gpu_wheels = _bench("gpu_wheels")
    wheel = _wheel(
        tmp_path / "demo-1.0-py3-none-any.whl",
        {
            "demo/__init__.py": b"VALUE = 1\n",
            "demo/libdemo_cuda118.so": b"x" * 5000,
            "studio/app.js": b"y" * 3000,
            "demo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n",
            "demo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        },
        scripts="[console_scripts]\ndemo = demo:main\ndemo-studio = studio.cli:app\n",
    )
    saved = gpu_wheels.strip_wheel(wheel, ("demo/libdemo_cuda118", "studio/"), ("studio",))
    assert saved > 0
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        record = z.read("demo-1.0.dist-info/RECORD").decode()
        scripts = z.read("demo-1.0.dist-info/entry_points.txt").decode()
    assert "demo/__init__.py" in names and not any(n.startswith(("studio/", "demo/libdemo")) for n in names)
    assert "studio" not in record and "demo/__init__.py,sha256=" in record
    assert "demo = demo:main" in scripts and "studio" not in scripts
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
    )
    assert (target / "demo" / "__init__.py").read_text() == "VALUE = 1\n"


def test_the_carry_sets_fit_one_device_call():
    gpu_wheels = _bench("gpu_wheels")
    out = BENCH.parent / ".gpu-wheels"
    if not (out / ".built").exists():
        pytest.skip("make envs builds .gpu-wheels")
    sizes = {name: gpu_wheels.mib(out / name) for name in ("slimrl", "unsloth")}
    assert 0 < sizes["slimrl"] and 0 < sizes["unsloth"] and sum(sizes.values()) < gpu_wheels.LIMIT_MIB, sizes
    names = {w.name.split("-")[0].lower() for w in (out / "unsloth").glob("*.whl")}
    assert {"unsloth", "unsloth_zoo", "trl", "datasets", "torchao"} <= names


def _dist(target: Path, name: str, version: str, *requires: str) -> None:
    info = target / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = [f"Name: {name}", f"Version: {version}", *(f"Requires-Dist: {r}" for r in requires)]
    (info / "METADATA").write_text("\n".join(lines) + "\n")


def test_the_unsloth_set_check_names_what_is_missing_or_conflicting(tmp_path):
    gpu_unsloth = _bench("gpu_unsloth")
    _dist(
        tmp_path,
        "unsloth",
        "2026.10.9",
        "trl<=1.15.0",
        "transformers<=5.17.0",
        "xformers>=0.0.27",
        "pywin32; sys_platform == 'win32'",
        "lm_eval; extra == 'eval'",
        "nowhere-pkg>=1",
    )
    _dist(tmp_path, "trl", "1.15.0", "datasets>=6")
    report = gpu_unsloth.check(tmp_path, "3.12", rehearsal=True)
    assert not report["ok"]
    assert report["unmet"] == ["trl needs datasets>=6: found 5.2.0", "unsloth needs nowhere-pkg>=1: absent"]
    assert report["not_carried"] == ["xformers"] and "transformers" in report["from_machine"]
