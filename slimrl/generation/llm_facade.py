"""``model.vllm_engine`` as Unsloth's notebooks use it: vLLM's ``LLM``. There it *is* the ``LLM``; here it is slimrl's
engine (:class:`slimrl.generation.engine.SlimrlEngine`), which answers the calls those notebooks make (Unsloth's own
notebooks and the scripts people build from them: ``sleep``, ``wake_up``, ``generate``, ``chat``,
``reset_prefix_cache``, ``get_tokenizer``, ``llm_engine``, ``collective_rpc``) as vLLM's do, over its own start and
standby:

* ``sleep(level=1)`` frees the KV cache until the next generation (slimrl's standby). vLLM's level 1 would also move
  the weights to the host and level 2 drop them; slimrl's engine runs on the training model's own weights, so they
  stay where they are, and the first ``sleep`` with a level above 0 says so in one line. ``wake_up(tags)`` takes the
  KV cache back (any tags: a generation wakes the engine by itself too).
* ``generate(prompts, sampling_params, lora_request=...)`` and ``chat(messages, sampling_params, ...)`` are vLLM's own
  calls on the started engine, woken first: a string, a list of them, token ids (``list[int]`` or lists of them) or
  vLLM's prompt dicts; without ``lora_request`` the base weights generate, as with vLLM.
"""

from __future__ import annotations

from typing import Any


def _token_lists(prompts: Any) -> bool:
    return (
        isinstance(prompts, list)
        and bool(prompts)
        and all(isinstance(p, list) and all(isinstance(t, int) for t in p) for p in prompts)
    )


class LLMFacade:
    """vLLM ``LLM``'s calls on slimrl's engine (module docstring). The engine provides ``start``, ``standby``,
    ``resume``, ``llm`` and ``asleep``."""

    _said_weights_stay = False

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        """vLLM's ``LLM.sleep``: the KV cache is released; the weights stay (they are the training model's)."""
        if level and not LLMFacade._said_weights_stay:
            LLMFacade._said_weights_stay = True
            print(
                f"slimrl: model.vllm_engine.sleep(level={level}) released the engine's KV cache; its weights are the "
                f"training model's own, so they stay (nothing to offload)",
                flush=True,
            )
        self.standby()

    def wake_up(self, tags: list[str] | None = None) -> bool:
        """vLLM's ``LLM.wake_up``: the KV cache back; True (fully awake)."""
        self.resume()
        return True

    def generate(
        self,
        prompts: Any,
        sampling_params: Any = None,
        *,
        use_tqdm: Any = False,
        lora_request: Any = None,
        **kwargs: Any,
    ) -> list:
        """vLLM's ``LLM.generate`` on the started engine, woken first."""
        self.start()
        self.resume()
        if isinstance(prompts, list) and prompts and all(isinstance(t, int) for t in prompts):
            prompts = [prompts]
        if _token_lists(prompts):
            prompts = [{"prompt_token_ids": p} for p in prompts]
        return self.llm.generate(
            prompts, sampling_params=sampling_params, use_tqdm=use_tqdm, lora_request=lora_request, **kwargs
        )

    def chat(
        self,
        messages: Any,
        sampling_params: Any = None,
        *,
        use_tqdm: Any = False,
        lora_request: Any = None,
        **kwargs: Any,
    ) -> list:
        """vLLM's ``LLM.chat`` (the model's chat template applied by vLLM) on the started engine, woken first."""
        self.start()
        self.resume()
        return self.llm.chat(
            messages, sampling_params=sampling_params, use_tqdm=use_tqdm, lora_request=lora_request, **kwargs
        )

    def reset_prefix_cache(self, *args: Any, **kwargs: Any) -> bool:
        return bool(self.start().reset_prefix_cache(*args, **kwargs))

    def get_tokenizer(self) -> Any:
        return self.start().get_tokenizer()

    def collective_rpc(self, method: Any, *args: Any, **kwargs: Any) -> list:
        return self.start().collective_rpc(method, *args, **kwargs)

    @property
    def llm_engine(self) -> Any:
        return self.start().llm_engine
