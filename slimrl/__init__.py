"""slimrl: TRL's RL trainers with far less memory and time, same math.

    from slimrl import FastLanguageModel, PatchFastRL
    PatchFastRL("grpo", FastLanguageModel)
"""

from slimrl.models import FastLanguageModel
from slimrl.patching import PatchFastRL, unpatch
from slimrl.sampling import vLLMSamplingParams

__all__ = ["FastLanguageModel", "PatchFastRL", "unpatch", "vLLMSamplingParams"]
__version__ = "0.1.0"
