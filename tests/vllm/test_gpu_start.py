"""Every Unsloth notebook of ``../shared/real_scripts*/`` that asks for ``fast_inference``, in its original
configuration (model shape, 16- or 4-bit, ``gpu_memory_utilization``, ``max_seq_length``, ``max_lora_rank``), on every
GPU of slimrl's table: what slimrl would hand vLLM passes vLLM's own GPU checks, called here (``.venv-vllm`` holds
vLLM's whole tree; its CUDA platform module imports once its compiled ops are stood in for):

* ``request_memory`` (``vllm/v1/worker/utils.py``), on the memory state of the GPU at the moment slimrl starts the
  engine: the card presented through torch's CUDA API (tests/fake_gpu.py), the training model's weights and adapter
  placed on it as the load and ``get_peft_model`` would, vLLM's ``LLM`` replaced by a stand-in that runs the check
  with the arguments slimrl passed. Where slimrl's own check (run before any weight loads) says no, it says so in
  one line and vLLM's says no too;
* the platform's dtype check (``CudaPlatform.check_if_supports_dtype``: no bf16 below compute capability 8.0) on the
  dtype slimrl loads in, and the attention back ends vLLM would pick for the KV-cache dtype slimrl asks for.
"""

from __future__ import annotations

import ast
import gc
import re
import sys
import types
from pathlib import Path

import pytest
import torch

from slimrl.compat.gpus import GPUS
from slimrl.generation import vllm_status

pytestmark = pytest.mark.skipif(vllm_status() is not None, reason=f"vLLM not usable here: {vllm_status()}")
ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"
MODEL_SHAPES = {
    "unsloth/Qwen3-4B-Base": "qwen3-4b",
    "unsloth/meta-Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "unsloth/Qwen3-8B": "qwen3-8b",
}
VISION = ("VL",)  # vision-language notebooks: slimrl's engine does not serve them (HF generate, said in one line)


def _literal(node, names):
    if isinstance(node, ast.Name):
        return names.get(node.id)
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def notebook_configs() -> dict[str, dict]:
    """{script: its original from_pretrained settings} of the Unsloth notebooks asking for fast_inference."""
    found = {}
    for path in sorted(SHARED.glob("real_scripts*/unsloth_*.py")):
        text = path.read_text()
        tree = ast.parse(text)
        names = {
            t.id: _literal(n.value, {})
            for n in tree.body
            if isinstance(n, ast.Assign)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        cut = re.search(r"'max_seq_length = (\d+) #' ->", text)
        if cut:
            names["max_seq_length"] = int(cut.group(1))
        model = re.search(r"'model_name = \"([^\"]+)\"", text)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "from_pretrained":
                kw = {k.arg: _literal(k.value, names) for k in node.keywords if k.arg}
                if kw.get("fast_inference"):
                    found[path.stem] = {
                        "model": model.group(1) if model else None,
                        "load_in_4bit": bool(kw.get("load_in_4bit")),
                        "gpu_memory_utilization": kw.get("gpu_memory_utilization", 0.5),
                        "max_seq_length": kw.get("max_seq_length", 2048),
                        "max_lora_rank": kw.get("max_lora_rank", 64),
                    }
    return found


CONFIGS = notebook_configs() if SHARED.is_dir() else {}


def _config(shape: str):
    from transformers import AutoConfig

    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_shapes import SHAPES

    return AutoConfig.for_model(**SHAPES[shape])


@pytest.fixture(scope="module")
def cuda_platform():
    """vLLM's CUDA platform class, importable on this CPU build once its compiled ops module is stood in for."""
    sys.modules.setdefault("vllm._C_stable_libtorch", types.ModuleType("vllm._C_stable_libtorch"))
    from vllm.platforms import cuda

    return cuda.NonNvmlCudaPlatform


def test_the_notebooks_are_found():
    if not SHARED.is_dir():
        pytest.skip("../shared/real_scripts* are not here")
    assert {"unsloth_Qwen3_4B_GRPO", "unsloth_Llama3.1_8B_GRPO"} <= set(CONFIGS), CONFIGS
    for name, cfg in CONFIGS.items():
        assert cfg["model"] in MODEL_SHAPES or any(v in cfg["model"] for v in VISION), (name, cfg["model"])


def _start(fake_gpu, monkeypatch, gpu_key, cfg, cached: int = 0):
    """slimrl's engine start on ``gpu_key`` for notebook settings ``cfg``: (vLLM's verdict at LLM(), slimrl's
    error or None, slimrl's pre-load verdict). ``cached``: bytes the caching allocator holds reserved but unallocated
    when the engine starts (a freed load buffer, a notebook's earlier cell)."""
    from vllm.v1.worker.utils import request_memory

    from slimrl.generation import engine as engine_module
    from slimrl.generation import shared_loader
    from slimrl.models.engine_setup import start_on_gpu
    from slimrl.models.sizes import adapter_bytes, weight_bytes

    gpu = fake_gpu(gpu_key)
    config = _config(MODEL_SHAPES[cfg["model"]])
    dtype = gpu.gpu.dtype
    _, preload_problem, _ = start_on_gpu(
        gpu.gpu,
        config,
        cfg["gpu_memory_utilization"],
        cfg["max_seq_length"],
        cfg["load_in_4bit"],
        cfg["max_lora_rank"],
        dtype=dtype,
    )
    weights = weight_bytes(config, dtype, cfg["load_in_4bit"])
    gpu.place(weights + adapter_bytes(config, cfg["max_lora_rank"]))  # the model and its adapter, loaded
    gpu.place(cached)
    gpu.release(cached, keep_cached=True)
    monkeypatch.setattr(shared_loader, "external_bytes", lambda model, device: weights)
    monkeypatch.setattr(shared_loader, "source_args", lambda model: {"load_format": shared_loader.LOAD_FORMAT})
    verdict = {}

    class LLM:  # vLLM's worker start-up, as far as its memory check goes
        def __init__(self, **kwargs):
            gc.collect()  # what vLLM's GPU worker does before its snapshot (gpu_worker.py, init_device)
            torch.cuda.empty_cache()
            free, total = torch.cuda.mem_get_info()
            snapshot = types.SimpleNamespace(total_memory=total, free_memory=free, device_="cuda:0")
            cache = types.SimpleNamespace(gpu_memory_utilization=kwargs.get("gpu_memory_utilization", 0.92))
            try:
                request_memory(snapshot, cache, weights)
                verdict["vllm"] = "passes"
            except ValueError as err:
                verdict["vllm"] = f"fails: {err}"
            verdict["dtype"] = kwargs["dtype"]

        def collective_rpc(self, fn):
            return []

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM))
    engine = engine_module.SlimrlEngine(
        "unused", dtype, cfg["max_seq_length"], cfg["max_lora_rank"], cfg["gpu_memory_utilization"]
    )
    import transformers

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", classmethod(lambda cls, *a, **k: config))
    stand_in = torch.nn.Linear(2, 2)  # the training model (its weights counted through external_bytes)
    try:
        engine.start(stand_in)
        error = None
    except MemoryError as err:
        error = str(err)
    return verdict, error, preload_problem


@pytest.mark.parametrize("gpu_key", [g.key for g in GPUS])
@pytest.mark.parametrize("notebook", sorted(CONFIGS))
def test_vllm_accepts_what_slimrl_starts_and_refuses_what_slimrl_refuses(
    fake_gpu, monkeypatch, cuda_platform, gpu_key, notebook
):
    cfg = CONFIGS[notebook]
    if any(v in (cfg["model"] or "") for v in VISION):
        pytest.skip("a vision-language notebook: slimrl's engine does not serve it (HF generate, one line)")
    verdict, error, preload = _start(fake_gpu, monkeypatch, gpu_key, cfg)
    if error is None:
        assert verdict["vllm"] == "passes", (notebook, gpu_key, verdict)
        assert preload is None, "the pre-load check refused a start vLLM accepts"
        from vllm.platforms.interface import DeviceCapability

        gpu = next(g for g in GPUS if g.key == gpu_key)
        monkeypatch.setattr(
            cuda_platform,
            "get_device_capability",
            classmethod(lambda cls, device_id=0: DeviceCapability(*gpu.capability)),
        )
        cuda_platform.check_if_supports_dtype(getattr(torch, verdict["dtype"]))  # vLLM's dtype check
    else:
        assert not verdict, "slimrl started vLLM after refusing"
        assert preload is not None and "\n" not in error and "gpu_memory_utilization" in error, error


def _vllms_verdict(utilization: float, external: int) -> bool:
    """vLLM's GPU worker on the presented card now: ``gc.collect()``, the allocator's cache emptied, the snapshot,
    ``request_memory`` (gpu_worker.py ``init_device``); True when it starts."""
    from vllm.v1.worker.utils import request_memory

    gc.collect()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    snapshot = types.SimpleNamespace(total_memory=total, free_memory=free, device_="cuda:0")
    try:
        request_memory(snapshot, types.SimpleNamespace(gpu_memory_utilization=utilization), external)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("gpu_key", [g.key for g in GPUS])
def test_bytes_the_allocator_holds_but_does_not_use_count_as_free_as_vllm_counts_them(
    fake_gpu, monkeypatch, cuda_platform, gpu_key
):
    """A model of 30 % of the card (the weights the engine shares) and 30 % more placed (what training holds), and
    reserved-but-unallocated bytes (a freed load buffer) beside them at the engine's start: slimrl's verdict on the
    engine's arguments equals vLLM's own check on the same state, for utilizations on both sides of the line."""
    from slimrl.generation import engine as engine_module
    from slimrl.generation import shared_loader

    gpu = fake_gpu(gpu_key)
    weights = int(gpu.gpu.total_bytes * 0.3)
    monkeypatch.setattr(shared_loader, "external_bytes", lambda model, device: weights)
    collected = []
    monkeypatch.setattr(gc, "collect", lambda *a: collected.append(1) or 0)  # ~1.5 s each beside vLLM's modules
    gpu.place(2 * weights)
    outcomes = set()
    for cached in (2 * 2**30, gpu.gpu.total_bytes // 5):
        for utilization in (0.4, 0.5, 0.6, 0.7, 0.8, 0.9):
            engine = engine_module.SlimrlEngine("unused", gpu.gpu.dtype, 1024, 16, utilization)
            verdicts = []
            for side in ("slimrl", "vllm"):
                gpu.place(cached)
                gpu.release(cached, keep_cached=True)
                if side == "slimrl":
                    try:
                        engine._cuda_memory_args(torch.nn.Linear(2, 2))
                        verdicts.append(True)
                    except MemoryError:
                        verdicts.append(False)
                else:
                    verdicts.append(_vllms_verdict(utilization, weights))
            assert verdicts[0] == verdicts[1], (gpu_key, cached, utilization)
            outcomes.add(verdicts[1])
    assert outcomes == {True, False}, "no utilization on the refused side: the comparison would be vacuous"
    assert len(collected) == 2 * 12, "slimrl's measure collects garbage first, as vLLM's worker does"


def test_the_issues_cases(fake_gpu, monkeypatch, cuda_platform):
    """Qwen3-4B 16-bit at 0.9 on an H100 and Llama-3.1-8B 4-bit at 0.9 on an A100-40GB start; on a T4, bf16 is what
    torch's own check would have picked and what vLLM refuses there."""
    from vllm.platforms.interface import DeviceCapability

    qwen = {
        "model": "unsloth/Qwen3-4B-Base",
        "load_in_4bit": False,
        "gpu_memory_utilization": 0.9,
        "max_seq_length": 2048,
        "max_lora_rank": 32,
    }
    llama = {
        "model": "unsloth/meta-Llama-3.1-8B-Instruct",
        "load_in_4bit": True,
        "gpu_memory_utilization": 0.9,
        "max_seq_length": 1024,
        "max_lora_rank": 32,
    }
    assert _start(fake_gpu, monkeypatch, "h100", qwen)[0]["vllm"] == "passes"
    assert _start(fake_gpu, monkeypatch, "a100-40gb", llama)[0]["vllm"] == "passes"
    fake_gpu("t4")
    monkeypatch.setattr(
        cuda_platform, "get_device_capability", classmethod(lambda cls, device_id=0: DeviceCapability(7, 5))
    )
    assert torch.cuda.is_bf16_supported()
    with pytest.raises(ValueError, match="Bfloat16 is only supported"):
        cuda_platform.check_if_supports_dtype(torch.bfloat16)
    from slimrl.models.targets import _default_dtype

    cuda_platform.check_if_supports_dtype(_default_dtype())


@pytest.mark.parametrize("gpu_key", [g.key for g in GPUS])
def test_fp8_kv_cache_only_where_vllm_has_a_backend_for_it(fake_gpu, cuda_platform, gpu_key):
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.selector import AttentionSelectorConfig

    from slimrl.models.engine_setup import kv_cache_dtype

    gpu = fake_gpu(gpu_key).gpu
    chosen = kv_cache_dtype(True, engine=True)
    assert chosen == ("fp8" if gpu.capability >= (8, 9) else "auto")
    if chosen == "fp8":
        selector = AttentionSelectorConfig(head_size=128, dtype=gpu.dtype, kv_cache_dtype="fp8", block_size=None)
        valid, _ = cuda_platform.get_valid_backends(DeviceCapability(*gpu.capability), selector)
        assert valid, f"vLLM has no attention back end for an fp8 KV cache on {gpu.name}"


@pytest.mark.parametrize(
    ("shape", "gpu_key", "four_bit", "seq"),
    [("qwen3-4b", "h100", False, 2048), ("llama-3.1-8b", "a100-40gb", True, 1024)],
)
def test_vllms_check_passes_on_what_slimrl_plan_reports(tmp_path, capsys, shape, gpu_key, four_bit, seq):
    """The issue's two cases, from ``slimrl plan --gpu ... --json`` alone: vLLM's ``request_memory`` on the plan's
    free memory at the engine's start, the card's total, the utilization and the weights held outside the engine."""
    import json

    from vllm.v1.worker.utils import request_memory

    from slimrl.cli import plan as plan_cli
    from tests.planning.test_plan_gpu import shape_dir

    argv = [
        "--model",
        shape_dir(tmp_path, shape),
        "--gpu",
        gpu_key,
        "--fast_inference",
        "true",
        "--gpu_memory_utilization",
        "0.9",
        "--max_seq_length",
        str(seq),
        "--lora_r",
        "32",
        "--load_in_4bit",
        str(four_bit).lower(),
        "--json",
    ]
    assert plan_cli.main(argv) == 0
    plan = json.loads(capsys.readouterr().out)
    engine = plan["engine"]
    snapshot = types.SimpleNamespace(
        total_memory=engine["total_bytes"], free_memory=engine["free_bytes_at_start"], device_="cuda:0"
    )
    cache = types.SimpleNamespace(gpu_memory_utilization=engine["gpu_memory_utilization"])
    request_memory(snapshot, cache, engine["external_weight_bytes"])  # raises where vLLM would not start
    assert plan["vllm_startup_check"] == "passes"


def test_fp8_threshold_is_vllms_own(fake_gpu):
    """vLLM's fp8 linear method states its minimum compute capability (``Fp8Config.get_min_capability``): slimrl asks
    for FP8 exactly on the table's GPUs at or above it. (Its W8A8 switch, ``supports_fp8`` = capability 8.9, lives in
    vLLM's CUDA platform module, which does not import on the CPU build: slimrl's ``Gpu.fp8`` states the same 8.9.)"""
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    from slimrl.compat.gpus import GPUS
    from slimrl.models import engine_setup

    for gpu in GPUS:
        fake_gpu(gpu.key)
        major, minor = gpu.capability
        assert (engine_setup.engine_quantization(True, engine=True) == "fp8") == (
            major * 10 + minor >= Fp8Config.get_min_capability()
        ), gpu.name


def test_an_fp8_engine_asks_vllm_for_fp8_and_shares_nothing(monkeypatch, tmp_path):
    """The engine's arguments for ``load_in_fp8``: vLLM's ``quantization="fp8"`` on its own copy (vLLM quantizes as
    it loads; the trainer keeps its 16-bit weights), not the shared loader."""
    import vllm

    from slimrl.generation.engine import SlimrlEngine
    from tests.tiny import save_tiny_family

    seen = {}

    class StopError(Exception):
        pass

    def capture(**kwargs):
        seen.update(kwargs)
        raise StopError

    monkeypatch.setattr(vllm, "LLM", capture)
    path = save_tiny_family("qwen2", tmp_path)
    engine = SlimrlEngine(path, torch.float32, 128, 8, 0.3, quantization="fp8")
    with pytest.raises(StopError):
        engine.start(torch.nn.Linear(2, 2))
    assert seen["quantization"] == "fp8" and "load_format" not in seen
