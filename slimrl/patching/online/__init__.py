"""What the online trainers (GRPO, RLOO: they generate their own completions) share beyond every trainer's
machinery: one log-prob method (:mod:`~slimrl.patching.online.logps`), one training-step wrapper
(:mod:`~slimrl.patching.online.step`), out-of-memory recovery (:mod:`~slimrl.patching.online.oom`), auto-fit to a
memory budget (:mod:`~slimrl.patching.online.autofit`), the longest-first first step
(:mod:`~slimrl.patching.online.longest_first`), GRPO's old-log-prob reuse (:mod:`~slimrl.patching.online.old_logps`)
and the engine in place of TRL's vLLM client (:mod:`~slimrl.patching.online.engine_hooks`)."""
