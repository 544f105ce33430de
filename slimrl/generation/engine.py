"""``SlimrlEngine``: an in-process vLLM engine on the same base weights as the training model.

Created by ``FastLanguageModel.from_pretrained(..., fast_inference=True)`` as ``model.vllm_engine``; the vLLM ``LLM``
itself starts on first use (the first generation), when the adapter exists and its optimizer state can be
counted, so ``gpu_memory_utilization="auto"`` can size the KV cache from what is really free
(:mod:`slimrl.generation.memory`).

* LoRA on, rank up to ``max_lora_rank`` (rounded up to a rank vLLM supports).
* :meth:`SlimrlEngine.load_adapter` hands the live adapter to the engine as tensors (a new adapter id each time;
  no merge, no full-weight push, no file): ``LLM.collective_rpc`` runs :func:`_install_adapter` on the worker, which
  builds vLLM's ``LoRAModel`` from the tensors and puts it in the worker's adapter cache in place of the previous
  one. The generation request then names the id, which the worker finds already loaded.
* :meth:`SlimrlEngine.standby` / :meth:`SlimrlEngine.resume`: the KV cache is freed between generations, weights
  kept: on CUDA vLLM's ``release_kv_cache_memory`` (its sleep level 1 where that is missing and no weight is
  shared); on CPU, where vLLM has no sleep mode, the KV cache's pages are released to the OS
  (:func:`slimrl.generation.memory.release_host_pages`).
* The engine is built on the training model's own weights (:mod:`slimrl.generation.shared_loader`): one copy of
  the base on the device, a 4-bit (QLoRA) base included, whose layers the engine runs through the training model's
  own 4-bit modules; what vLLM repacks (its CPU back end's oneDNN linear layers) is its own copy.
* On vLLM's CPU back end its PyTorch LoRA ops get a single-adapter fast path (:mod:`slimrl.generation.cpu_lora`).
* Sampled-token log-probs are vLLM's ``processed_logprobs`` (after temperature and logit processing), the ones
  TRL's importance-sampling correction needs.
"""

from __future__ import annotations

import os
import time
import weakref
from collections import defaultdict
from typing import Any

import torch

from slimrl.compat.engine_memory import MAX_NUM_SEQS, EngineStart, cuda_engine_start, fix_for, startup_problem
from slimrl.compat.gpus import local_cuda_index
from slimrl.compat.memory import PeakWindow, free_bytes_as_vllm_measures, reset_peak, total_bytes
from slimrl.compat.vllm_info import kv_bytes_per_token, supported_lora_rank
from slimrl.generation import cpu_lora, engine_guards, shared_loader
from slimrl.generation.llm_facade import LLMFacade
from slimrl.generation.memory import kv_cache_bytes, release_host_pages
from slimrl.generation.weights import adapter_tensors, share_base_weights, shared_storage_bytes

_ADAPTER_PATH = "slimrl://in-memory"  # never read: the adapter is in the worker's cache before the request


def _install_adapter(worker: Any, lora_id: int, tensors: dict, config: dict) -> bool:
    """Runs on the vLLM worker: build a ``LoRAModel`` from tensors and cache it under ``lora_id`` (only one kept)."""
    from vllm.lora.peft_helper import PEFTHelper

    manager = worker.model_runner.lora_manager
    helper = PEFTHelper.from_dict({**config, "vllm_max_position_embeddings": manager.max_position_embeddings})
    helper.validate_legal(manager.lora_config)
    model = manager._adapter_manager.model
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    lora = manager._lora_model_cls.from_lora_tensors(
        lora_model_id=lora_id,
        tensors=tensors,
        peft_helper=helper,
        device="cpu",
        dtype=manager.lora_config.lora_dtype,
        model_vocab_size=manager.vocab_size,
        weights_mapper=mapper.get_rename_mapper() if mapper is not None else None,
        skip_prefixes=getattr(model, "lora_skip_prefixes", None),
    )
    manager.remove_all_adapters()
    return manager._adapter_manager.add_adapter(lora)


def rank_args(seed: int) -> dict[str, Any]:
    """With several processes (torchrun, accelerate), each rank's engine in its own process on its own device, as
    TRL's colocate mode starts them: vLLM joins the process group already there (``external_launcher``), one rank
    per engine, each with its own sampling seed."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return {}
    return {
        "distributed_executor_backend": "external_launcher",
        "tensor_parallel_size": 1,
        "seed": seed + dist.get_rank(),
    }


def _kv_cache_tensors(worker: Any) -> list[torch.Tensor]:
    return [t for t in getattr(worker.model_runner, "kv_caches", []) if isinstance(t, torch.Tensor)]


def _engine_model(worker: Any) -> torch.nn.Module:
    return worker.model_runner.model


class SlimrlEngine(LLMFacade):
    """Colocated vLLM engine for one base model (see the module docstring); notebooks call it as vLLM's ``LLM``
    (:class:`slimrl.generation.llm_facade.LLMFacade`)."""

    def __init__(
        self,
        model_path: str,
        dtype: torch.dtype,
        max_seq_length: int,
        max_lora_rank: int,
        gpu_memory_utilization: float | str,
        seed: int = 0,
        max_num_seqs: int = MAX_NUM_SEQS,
        kv_cache_dtype: str = "auto",
        quantization: str | None = None,
    ) -> None:
        self.model_path = model_path
        self.dtype = dtype
        self.max_seq_length = max_seq_length
        self.max_lora_rank = supported_lora_rank(max_lora_rank)
        self.gpu_memory_utilization = gpu_memory_utilization
        self.seed = seed
        self.max_num_seqs = max_num_seqs
        self.kv_cache_dtype = kv_cache_dtype  # "auto" (the weights' dtype) or "fp8" (CUDA)
        self.quantization = quantization  # vLLM's for its weights ("fp8": its own copy, quantized as it loads)
        # each process's engine on its own GPU (TRL's colocate mode: one engine per rank)
        self.device = torch.device("cuda", local_cuda_index()) if torch.cuda.is_available() else torch.device("cpu")
        self.start_args: EngineStart | None = None  # what vLLM was given on a GPU (and the GPU's state then)
        self.llm: Any = None
        self.lora_request: Any = None
        self.adapter_id = 0
        self.asleep = False
        self._wake_tags: tuple = ()  # what resume() wakes on CUDA (set by standby)
        self.shared_bytes = 0
        self.kv_cache_bytes: int | None = None
        self.phase_peaks: dict[str, int] = {}  # "generation" / "training" -> peak bytes of the last such phase
        self._phase: PeakWindow | None = None  # the phase now running (from its start)
        self.timings: dict[str, float] = defaultdict(float)
        self._bound: weakref.ref | None = None  # the training model a start without one builds on
        self._planned_trainable = 0  # its trainable bytes once the adapter exists (for "auto" before it does)

    def bind(self, training_model: torch.nn.Module, planned_trainable_bytes: int) -> None:
        """The model this engine serves: a start before any trainer exists (``model.fast_generate``,
        ``model.vllm_engine.generate`` in a notebook's first cells) builds on its weights too, so the engine never
        samples from a copy of other numbers (a 16-bit copy of a 4-bit model) and the trainer built later uses
        that same engine. ``planned_trainable_bytes``: what the adapter (or full fine-tuning) will train, counted
        for ``gpu_memory_utilization="auto"`` while no adapter exists yet."""
        self._bound = weakref.ref(training_model)
        self._planned_trainable = planned_trainable_bytes

    def _trainable_bytes(self, training_model: torch.nn.Module) -> int:
        if training_model is not (self._bound() if self._bound is not None else None):
            return sum(p.numel() * p.element_size() for p in training_model.parameters() if p.requires_grad)
        return self._planned_trainable  # the bound model itself: its adapter is yet to come

    # -- start ---------------------------------------------------------------------------------------------------
    def start(self, training_model: torch.nn.Module | None = None) -> Any:
        """Start vLLM (once): KV cache sized now, base weights shared with ``training_model`` (default: the bound
        model, :meth:`bind`) where possible."""
        if self.llm is not None:
            return self.llm
        if training_model is None and self._bound is not None:
            training_model = self._bound()
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: tensors cross by reference
        from transformers import AutoConfig
        from vllm import LLM

        trainable = self._trainable_bytes(training_model) if training_model is not None else 0
        kv_dtype = torch.float8_e4m3fn if self.kv_cache_dtype == "fp8" else self.dtype
        hf_config = AutoConfig.from_pretrained(self.model_path)
        per_token = kv_bytes_per_token(hf_config, kv_dtype)
        self.kv_cache_bytes = kv_cache_bytes(
            self.gpu_memory_utilization, self.device, per_token, self.max_num_seqs * self.max_seq_length, trainable
        )
        kwargs: dict[str, Any] = {
            "model": self.model_path,
            "dtype": str(self.dtype).removeprefix("torch."),
            "enable_lora": True,
            "max_lora_rank": self.max_lora_rank,
            "max_loras": 1,
            "max_cpu_loras": 1,
            "max_model_len": self.max_seq_length,
            "max_num_seqs": self.max_num_seqs,
            "seed": self.seed,
            "logprobs_mode": "processed_logprobs",
            "trust_remote_code": False,
        }
        if self.kv_cache_dtype != "auto":
            kwargs["kv_cache_dtype"] = self.kv_cache_dtype
        kwargs.update(rank_args(self.seed))
        if shared_loader.saved_in_bitsandbytes(hf_config):
            if training_model is None:
                raise ValueError(
                    f"fast_inference: {self.model_path} is saved in bitsandbytes 4-bit, which vLLM "
                    "cannot load itself; start the engine from its model (FastLanguageModel."
                    "from_pretrained(..., fast_inference=True) does)"
                )
            kwargs["hf_overrides"] = {"quantization_config": None}  # served by the trainer's 4-bit modules
        if self.quantization is not None:  # vLLM quantizes its own copy as it loads: nothing to share
            kwargs["quantization"] = self.quantization
        elif training_model is not None:
            kwargs.update(shared_loader.source_args(training_model))
            if any(shared_loader.is_4bit(p) for p in training_model.parameters()):
                kwargs["enforce_eager"] = True  # bitsandbytes' kernels run as they are: no graph capture, no compile
        if self.device.type == "cuda":
            kwargs.update(self._cuda_memory_args(training_model), enable_sleep_mode=True)
        else:
            kwargs.update(
                {"kv_cache_memory_bytes": self.kv_cache_bytes}
                if self.kv_cache_bytes is not None
                else {"gpu_memory_utilization": float(self.gpu_memory_utilization)}
            )
            kwargs["enforce_eager"] = True  # no graph capture on CPU: faster start, same tok/s (measured)
            cpu_lora.install()  # one GEMM per LoRA op instead of a per-token weight gather (slimrl.generation.cpu_lora)
        t0 = time.perf_counter()
        self._phase = PeakWindow(self.device)  # the first generation phase: from the engine's start
        try:
            self.llm = LLM(**kwargs)
        finally:
            shared_loader.release(str(id(training_model)))
        self.timings["start_s"] = time.perf_counter() - t0
        if training_model is not None and self.quantization is None:
            self.share_weights(training_model)  # what the default loader read, where the shared one could not
            models = self.llm.collective_rpc(_engine_model)
            self.shared_bytes = shared_storage_bytes(training_model, models[0]) if len(models) == 1 else 0
            if len(models) == 1:
                engine_guards.guard(self, models[0])  # vLLM's sleep / load_weights leave the shared weights alone
        return self.llm

    def _cuda_memory_args(self, training_model: torch.nn.Module | None) -> dict[str, Any]:
        """vLLM's memory arguments on this GPU now, after vLLM's own start-up check passed on them
        (:mod:`slimrl.compat.engine_memory`); a one-line MemoryError where it would not."""
        shares = training_model is not None and self.quantization is None  # else vLLM's weights are its own
        external = shared_loader.external_bytes(training_model, self.device) if shares else 0
        self.start_args = cuda_engine_start(
            self.gpu_memory_utilization,
            free_bytes_as_vllm_measures(self.device),
            total_bytes(self.device),
            external,
            self.kv_cache_bytes,
        )
        problem = startup_problem(self.start_args)
        if problem:
            raise MemoryError(
                f"fast_inference: vLLM cannot start on this GPU beside the training model ({problem}); "
                f"{fix_for(self.start_args)}"
            )
        args: dict[str, Any] = {"gpu_memory_utilization": self.start_args.gpu_memory_utilization}
        if self.start_args.kv_cache_memory_bytes is not None:
            args["kv_cache_memory_bytes"] = self.start_args.kv_cache_memory_bytes
        return args

    def share_weights(self, training_model: torch.nn.Module) -> int:
        """Point the training model's frozen base weights at the engine's (in-process engines only)."""
        models = self.llm.collective_rpc(_engine_model)
        return share_base_weights(training_model, models[0]) if len(models) == 1 else 0

    # -- adapter -------------------------------------------------------------------------------------------------
    def load_adapter(self, peft_model: Any) -> Any:
        """Hand the live adapter of ``peft_model`` to the engine as tensors; returns the ``LoRARequest`` to use."""
        from vllm.lora.request import LoRARequest

        self.start(peft_model)
        t0 = time.perf_counter()
        tensors, config = adapter_tensors(peft_model, self.dtype)
        self.adapter_id += 1
        self.llm.collective_rpc(_install_adapter, args=(self.adapter_id, tensors, config))
        self.lora_request = LoRARequest(f"slimrl-{self.adapter_id}", self.adapter_id, _ADAPTER_PATH)
        self.timings["last_sync_s"] = time.perf_counter() - t0
        self.timings["sync_s"] += self.timings["last_sync_s"]
        self.timings["syncs"] += 1
        return self.lora_request

    # -- generation ----------------------------------------------------------------------------------------------
    def generate_ids(self, prompt_token_ids: list[list[int]], sampling_params: Any, lora_request: Any = None) -> list:
        """``LLM.generate`` on token-id prompts with the current adapter (woken first if in standby): the trainer's
        generation. (:meth:`generate` is vLLM's, for notebooks.)"""
        self.start()
        self.resume()
        t0 = time.perf_counter()
        outputs = self.llm.generate(
            [{"prompt_token_ids": ids} for ids in prompt_token_ids],
            sampling_params=sampling_params,
            use_tqdm=False,
            lora_request=lora_request if lora_request is not None else self.lora_request,
        )
        self.timings["generate_s"] += time.perf_counter() - t0
        return outputs

    # -- standby -------------------------------------------------------------------------------------------------
    def standby(self) -> int:
        """Free the KV cache until the next generation; returns bytes released (host pages on CPU)."""
        if self.llm is None or self.asleep:
            return 0
        self._next_phase("generation")
        if self.device.type == "cuda":
            released = self._cuda_standby()
        else:
            released = sum(self.llm.collective_rpc(lambda w: release_host_pages(_kv_cache_tensors(w))))
        self.asleep = True
        return released

    def _next_phase(self, ended: str) -> None:
        """Record the peak of the phase that ended and start the next one's window."""
        if self._phase is not None:
            self.phase_peaks[ended] = self._phase.peak_bytes()
        reset_peak(self.device)
        self._phase = PeakWindow(self.device)

    def _cuda_standby(self) -> int:
        """KV cache only: ``sleep(level=0)`` + ``release_kv_cache_memory()`` where vLLM has it (>= 0.32); its sleep
        level 1 would also move the weights to the host, under the training model's shared views, so with shared
        weights and an older vLLM there is no standby. (Covered on CPU only by the tests: no CUDA test machine.)
        """
        before = torch.cuda.mem_get_info()[0]
        if hasattr(self.llm, "release_kv_cache_memory"):
            self.llm.sleep(level=0)
            self.llm.release_kv_cache_memory()
            self._wake_tags = (["kv_cache"], ["scheduling"])
        elif self.shared_bytes == 0:
            self.llm.sleep(level=1)
            self._wake_tags = (None,)
        else:
            self._wake_tags = ()
        return torch.cuda.mem_get_info()[0] - before

    def resume(self) -> None:
        """Take the KV cache back (before a generation)."""
        if self.llm is None or not self.asleep:
            return
        self._next_phase("training")
        for tags in self._wake_tags if self.device.type == "cuda" else ():
            self.llm.wake_up(tags=tags)
        self.llm.reset_prefix_cache()  # released pages read as zeros: no cached prefix may be reused
        self.asleep = False

    def fast_generate(self, prompts: str | list, sampling_params: Any = None, lora_request: Any = None) -> list:
        """Unsloth's ``model.fast_generate``: :meth:`generate` (text, token ids or vLLM's prompt dicts) with
        ``lora_request`` (e.g. the one :meth:`load_adapter` returned) or the base weights."""
        return self.generate(prompts, sampling_params, lora_request=lora_request)
