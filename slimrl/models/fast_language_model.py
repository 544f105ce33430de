"""``FastLanguageModel``: load a causal LM offline, add LoRA through PEFT, switch inference/training modes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from slimrl.compat.gpus import load_device_map
from slimrl.compat.model_state import ModelState, attach_state, carry_over, model_state
from slimrl.compat.quant import BNB_CPU_MIN
from slimrl.compat.quant import bitsandbytes_works as _bitsandbytes_works
from slimrl.compat.runtime.callsite import warn
from slimrl.models import engine_setup, unsloth_keywords
from slimrl.models.chat_processor import accept_chat_messages
from slimrl.models.checkpointing import MODES as CHECKPOINTING_MODES
from slimrl.models.checkpointing import enable_checkpointing
from slimrl.models.fused_lora import fuse_lora
from slimrl.models.loader import resolve_model_path
from slimrl.models.methods import attach
from slimrl.models.modes import for_inference, for_training
from slimrl.models.quantized import keep_quantized_trainable
from slimrl.models.targets import _default_dtype, default_target_modules  # noqa: F401 - re-exported
from slimrl.models.tiled_mlp import tile_mlp
from slimrl.models.tokenizers import with_token_id_chat_templates
from slimrl.models.vision import is_vision_language, load_processor, vision_target_modules


class FastLanguageModel:
    """Unsloth-compatible entry point (``from slimrl import FastLanguageModel``)."""

    @classmethod
    def from_pretrained(
        cls,
        model_name: str = "SmolLM2-135M-Instruct",
        max_seq_length: int = 2048,
        dtype: torch.dtype | str | None = None,
        load_in_4bit: bool = False,
        fast_inference: bool = False,
        gpu_memory_utilization: float | str = 0.5,
        max_lora_rank: int = 64,
        gguf_file: str | None = None,
        load_in_8bit: bool = False,
        load_in_16bit: bool = False,
        full_finetuning: bool = False,
        random_state: int | None = None,
        float8_kv_cache: bool = False,
        use_gradient_checkpointing: str | bool | None = None,
        resize_model_vocab: int | None = None,
        use_exact_model_name: bool = False,
        unsloth_vllm_standby: bool = False,
        disable_log_stats: bool = True,
        **kwargs: Any,
    ) -> tuple[Any, Any]:
        """Load ``(model, tokenizer)``: a local directory or GGUF file, a hub id from the local cache, else downloaded
        like transformers (``token``, ``revision``, ``cache_dir``, ``local_files_only``, ``HF_HUB_OFFLINE``,
        ``HF_ENDPOINT``; see :mod:`slimrl.models.loader`).

        ``dtype=None``: bf16 on CUDA with bf16 support (fp16 on older GPUs), fp32 on CPU. ``load_in_4bit``: NF4
        through bitsandbytes on CUDA, and on CPU with bitsandbytes >= 0.50; elsewhere a warning and the model in
        ``dtype``. ``load_in_8bit``: LLM.int8() weights through bitsandbytes, under the same conditions. Quantized
        layers are kept trainable through generation (:mod:`slimrl.models.quantized`). ``max_seq_length`` is stored
        on the model (``model.max_seq_length``).

        ``fast_inference=True`` attaches a colocated vLLM engine for the same base weights as ``model.vllm_engine``
        (:class:`slimrl.generation.SlimrlEngine`; it starts at its first generation), LoRA enabled up to
        ``max_lora_rank``; ``gpu_memory_utilization`` is vLLM's fraction, or ``"auto"`` to size the KV cache from
        what is free after the model, the adapter and its optimizer state. Without vLLM (or without a device it
        supports) it warns once, naming what to install, and generation uses HF ``generate``.

        Unsloth's other keywords are accepted as :mod:`slimrl.models.unsloth_keywords` declares (``full_finetuning``:
        unquantized, and no adapter from :meth:`get_peft_model`; ``random_state``: the engine's seed;
        ``float8_kv_cache``: the engine's fp8 KV cache on CUDA; ``use_gradient_checkpointing``: the default of
        :meth:`get_peft_model`'s; ``resize_model_vocab``: the embedding resized; ``unsloth_tiled_mlp``: the MLPs
        run a tile of tokens at a time (:mod:`slimrl.models.tiled_mlp`); the ones that mean nothing here,
        such as ``offload_embedding``, with one line each).
        """
        if not isinstance(max_seq_length, int) or max_seq_length < 1:
            raise ValueError(f"max_seq_length must be a positive int, got {max_seq_length!r}")
        if not isinstance(max_lora_rank, int) or max_lora_rank < 1:
            raise ValueError(f"max_lora_rank must be a positive int, got {max_lora_rank!r}")
        del use_exact_model_name, unsloth_vllm_standby, disable_log_stats  # honoured as they are (unsloth_keywords)
        kwargs = unsloth_keywords.take("from_pretrained", kwargs)
        load_in_fp8 = kwargs.pop("load_in_fp8", False)
        tiled = kwargs.pop("unsloth_tiled_mlp", None)  # None: slimrl's default (patching/online/lean_default.py)
        if tiled is not None and (not isinstance(tiled, bool | int) or tiled < 0):
            raise ValueError(
                f"unsloth_tiled_mlp={tiled!r}: True (tiles of hidden_size tokens), False, or the tokens "
                "of one tile (an int)"
            )
        if full_finetuning and (load_in_4bit or load_in_8bit):
            unsloth_keywords.note(
                "from_pretrained(full_finetuning=True): the model loads unquantized (load_in_4bit/"
                "load_in_8bit ignored: a quantized base cannot train in full)"
            )
            load_in_4bit = load_in_8bit = False
        del load_in_16bit  # unquantized, in `dtype`: what load_in_4bit=load_in_8bit=False loads
        hub = {k: kwargs.pop(k) for k in ("revision", "token", "cache_dir", "local_files_only") if k in kwargs}
        path = resolve_model_path(
            model_name,
            gguf_file,
            **hub,
            use_safetensors=kwargs.get("use_safetensors", True) is not False,
            trust_remote_code=bool(kwargs.get("trust_remote_code", False)),
        )
        torch_dtype = _default_dtype() if dtype is None else dtype
        if isinstance(torch_dtype, str):
            torch_dtype = getattr(torch, torch_dtype)
        load_kwargs: dict[str, Any] = {"dtype": torch_dtype, **kwargs}
        if load_in_4bit and load_in_8bit:
            raise ValueError(
                "load_in_4bit=True and load_in_8bit=True: pass one of them (4-bit NF4 is the usual choice for QLoRA)"
            )
        if load_in_4bit or load_in_8bit:
            bits = "load_in_4bit" if load_in_4bit else "load_in_8bit"
            if _bitsandbytes_works():
                from transformers import BitsAndBytesConfig

                load_kwargs["quantization_config"] = (
                    BitsAndBytesConfig(
                        load_in_4bit=True,
                        bnb_4bit_quant_type="nf4",
                        bnb_4bit_compute_dtype=torch_dtype,
                        bnb_4bit_use_double_quant=True,
                    )
                    if load_in_4bit
                    else BitsAndBytesConfig(load_in_8bit=True)
                )
            else:
                warn(
                    f"{bits}=True needs bitsandbytes (CUDA, or CPU with bitsandbytes>="
                    f"{BNB_CPU_MIN}: pip install 'slimrl[quant]'); loading {model_name!r} unquantized "
                    f"in {torch_dtype} instead"
                )
        if not (
            gpu_memory_utilization == "auto"
            or isinstance(gpu_memory_utilization, int | float)
            and 0 < gpu_memory_utilization < 1
        ):
            raise ValueError(
                f"gpu_memory_utilization must be a float in (0, 1) or 'auto', got {gpu_memory_utilization!r}"
            )
        vision = cls._loads_vision(str(path), bool(load_kwargs.get("trust_remote_code", False)))
        problem = engine_setup.engine_problem(fast_inference, vision)
        if problem is not None:
            warn(f"fast_inference=True: {problem}; generation will use Hugging Face generate")
        engine = fast_inference and problem is None
        if engine:  # on a GPU: vLLM's start-up check, before any weight loads
            engine_setup.check_before_loading(
                str(path),
                gpu_memory_utilization,
                max_seq_length,
                "quantization_config" in load_kwargs and load_in_4bit,
                max_lora_rank,
                torch_dtype,
            )
        on_cpu = "cpu" if "quantization_config" in load_kwargs else None  # bitsandbytes needs it named
        device_map = load_device_map() or on_cpu  # on CUDA: on the GPU as it loads, shard by shard
        if device_map is not None:
            load_kwargs.setdefault("device_map", device_map)
        load_kwargs.setdefault("use_safetensors", True)  # safe defaults: no pickle, no remote code unless asked
        load_kwargs.setdefault("trust_remote_code", False)
        if load_kwargs["use_safetensors"] and Path(path).is_dir() and not any(Path(path).glob("*.safetensors")):
            raise ValueError(
                f"{model_name!r} has no .safetensors weights (only pickle-based files such as "
                f"pytorch_model.bin): slimrl loads safetensors only by default; convert the checkpoint "
                f"(model.save_pretrained(dir, safe_serialization=True)) or, for a file you trust, pass "
                f"use_safetensors=False"
            )
        model, tokenizer = _load(str(path), load_kwargs, vision)
        keep_quantized_trainable(model)
        text_tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a vision model's processor holds one
        if text_tokenizer.pad_token is None:
            text_tokenizer.pad_token = text_tokenizer.eos_token
        if getattr(model.generation_config, "pad_token_id", None) is None:
            model.generation_config.pad_token_id = text_tokenizer.pad_token_id
        model.max_seq_length = max_seq_length
        if resize_model_vocab is not None:
            model.resize_token_embeddings(int(resize_model_vocab))
        attach_state(
            model,
            ModelState(
                model_path=str(path),
                max_lora_rank=max_lora_rank,
                full_finetuning=bool(full_finetuning),
                vision=vision,
                tiled_mlp=tiled,
                checkpointing_default=use_gradient_checkpointing,
                tokenizer=text_tokenizer,
                processor=tokenizer if tokenizer is not text_tokenizer else None,
            ),
        )
        kv_dtype = engine_setup.kv_cache_dtype(bool(float8_kv_cache), engine)
        fp8 = engine_setup.engine_quantization(bool(load_in_fp8), engine)
        if engine:
            engine_setup.attach_engine(
                model,
                str(path),
                max_seq_length,
                max_lora_rank,
                gpu_memory_utilization,
                0 if random_state is None else random_state,
                kv_dtype,
                bool(full_finetuning),
                quantization=fp8,
            )
        if tiled:
            tile_mlp(model, None if tiled is True else int(tiled))
        attach(model)  # Unsloth's model methods: fast_generate, save_lora / load_lora, the export calls
        return model, tokenizer

    @staticmethod
    def _loads_vision(path: str, trust_remote_code: bool) -> bool:
        """Whether :meth:`from_pretrained` loads ``path`` as a vision-language model: never for
        ``FastLanguageModel`` (a causal LM)."""
        return False

    @staticmethod
    def get_peft_model(
        model: Any,
        r: int = 16,
        target_modules: list[str] | None = None,
        lora_alpha: int = 16,
        lora_dropout: float = 0.0,
        bias: str = "none",
        use_gradient_checkpointing: str | bool | None = None,
        random_state: int = 3407,
        max_seq_length: int | None = None,
        finetune_language_layers: bool = True,
        finetune_attention_modules: bool = True,
        finetune_mlp_modules: bool = True,
        finetune_vision_layers: bool = True,
        fused_lora: bool = True,
        **kwargs: Any,
    ) -> Any:
        """Wrap ``model`` with a LoRA adapter through PEFT (``r``, ``lora_alpha``, ``lora_dropout``, ``bias``).

        ``fused_lora=True`` (default) computes the LoRA projections with slimrl's fused ops, PEFT's math with less
        memory and traffic (:mod:`slimrl.models.fused_lora`; what they cannot serve runs PEFT's layers); False
        keeps PEFT's layers throughout.

        ``target_modules=None`` targets every attention and MLP projection of the architecture.
        ``use_gradient_checkpointing``: True checkpoints every decoder layer (non-reentrant); ``"slimrl"`` also
        keeps the checkpointed layer inputs in pinned host memory on CUDA (plain checkpointing on CPU, where there
        is no device memory to save; see :mod:`slimrl.models.checkpointing`); ``"selective"`` checkpoints only every
        ``checkpoint_every_n_layers``-th decoder layer (default 2); False leaves it off.
        ``random_state`` seeds the adapter initialisation. ``use_gradient_checkpointing=None``: the value given to
        :meth:`from_pretrained`, else ``"slimrl"``; ``"unsloth"`` is the same as ``"slimrl"``.

        Unsloth's keywords (:mod:`slimrl.models.unsloth_keywords`): PEFT's own (``use_rslora``, ``loftq_config``,
        ``init_lora_weights``, ``layers_to_transform``, ``modules_to_save``, ...) go to ``LoraConfig``;
        ``finetune_attention_modules`` / ``finetune_mlp_modules=False`` leave those projections out of the default
        targets; on a vision-language model (``FastModel`` / ``FastVisionModel``) ``finetune_vision_layers`` /
        ``finetune_language_layers=False`` leave out the vision tower / the language model
        (:func:`slimrl.models.vision.vision_target_modules`); ``max_seq_length`` is stored on the model; a model
        loaded with ``full_finetuning=True`` gets no adapter (one line) and trains every weight.
        """
        from peft import LoraConfig, get_peft_model

        loaded = model_state(model)
        chosen = use_gradient_checkpointing is None and loaded.checkpointing_default is None
        if use_gradient_checkpointing is None:
            default = loaded.checkpointing_default
            use_gradient_checkpointing = "slimrl" if default is None else default
        kwargs = unsloth_keywords.take("get_peft_model", kwargs)
        if kwargs.get("loftq_config") == {}:
            kwargs["loftq_config"] = None  # Unsloth's default: {} asks for no LoftQ
        if max_seq_length is not None:
            model.max_seq_length = max_seq_length
        max_rank = loaded.max_lora_rank
        if not isinstance(r, int) or r < 1:
            raise ValueError(f"r must be a positive int, got {r!r}")
        if max_rank is not None and r > max_rank:
            raise ValueError(
                f"r={r} is larger than max_lora_rank={max_rank} given to from_pretrained; "
                f"raise max_lora_rank to at least {r} or lower r"
            )
        if use_gradient_checkpointing not in CHECKPOINTING_MODES:
            raise ValueError(
                f"use_gradient_checkpointing must be 'slimrl', 'selective', True or False, got "
                f"{use_gradient_checkpointing!r}"
            )
        if not isinstance(fused_lora, bool):
            raise ValueError(f"fused_lora must be True or False, got {fused_lora!r}")
        every = kwargs.pop("checkpoint_every_n_layers", 2)
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"checkpoint_every_n_layers must be a positive int, got {every!r}")
        if loaded.full_finetuning:
            unsloth_keywords.note(
                "get_peft_model: the model was loaded with full_finetuning=True: no adapter added, every weight trains"
            )
            enable_checkpointing(model, use_gradient_checkpointing, every)
            return attach(model)
        if loaded.vision or is_vision_language(getattr(model, "config", None)):
            targets = target_modules or vision_target_modules(
                model,
                vision=finetune_vision_layers,
                language=finetune_language_layers,
                attention=finetune_attention_modules,
                mlp=finetune_mlp_modules,
            )
        elif not finetune_language_layers:
            raise ValueError(
                "get_peft_model(finetune_language_layers=False): a text model has nothing else to put "
                "an adapter on; pass finetune_language_layers=True"
            )
        else:
            targets = target_modules or default_target_modules(
                model, attention=finetune_attention_modules, mlp=finetune_mlp_modules
            )
        keep_quantized_trainable(model)  # a quantized base loaded elsewhere, maybe run in eval mode already
        torch.manual_seed(random_state)
        config = LoraConfig(
            r=r,
            lora_alpha=lora_alpha,
            lora_dropout=lora_dropout,
            bias=bias,
            target_modules=targets,
            task_type="CAUSAL_LM",
            **kwargs,
        )
        peft_model = get_peft_model(model, config)
        if fused_lora:
            fuse_lora(peft_model)
        enable_checkpointing(peft_model, use_gradient_checkpointing, every)
        loaded.checkpointing = use_gradient_checkpointing
        loaded.checkpointing_chosen = chosen
        loaded.fused_lora = fused_lora
        attach_state(model, loaded)
        carry_over(model, peft_model)
        return attach(peft_model)

    @staticmethod
    def for_inference(model: Any) -> Any:
        """Generation mode: eval, KV cache on, checkpointing off, left padding (see :mod:`slimrl.models.modes`)."""
        return for_inference(model)

    @staticmethod
    def for_training(model: Any) -> Any:
        """Back to training mode, exactly as before :meth:`for_inference` (see :mod:`slimrl.models.modes`)."""
        return for_training(model)


class FastModel(FastLanguageModel):
    """Unsloth's generic entry point (``from slimrl import FastModel``): the same calls as
    :class:`FastLanguageModel`; a vision-language model (its config has a ``vision_config``) loads with
    ``AutoModelForImageTextToText`` and ``from_pretrained`` returns ``(model, processor)``
    (:mod:`slimrl.models.vision`), text models as :class:`FastLanguageModel` loads them (Unsloth's Gemma 3 and
    gpt-oss notebooks use it)."""

    @staticmethod
    def _loads_vision(path: str, trust_remote_code: bool) -> bool:
        from transformers import AutoConfig

        return is_vision_language(AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code))


class FastVisionModel(FastModel):
    """Unsloth's vision entry point (``from slimrl import FastVisionModel``): :class:`FastModel` under the name
    Unsloth's vision notebooks import."""


def _load(path: str, load_kwargs: dict, vision: bool) -> tuple[Any, Any]:
    """(model, tokenizer) of a causal LM, or (model, processor) of a vision-language model."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

    trust = load_kwargs["trust_remote_code"]
    if vision:
        # Unsloth's loaders return a processor that takes chat messages as text (models/chat_processor.py)
        processor = accept_chat_messages(load_processor(path, trust))
        return AutoModelForImageTextToText.from_pretrained(path, **load_kwargs), processor
    model = AutoModelForCausalLM.from_pretrained(path, **load_kwargs)
    return model, with_token_id_chat_templates(AutoTokenizer.from_pretrained(path, trust_remote_code=trust))
