"""slimrl: TRL's RL trainers with far less memory and time, same math.

    from slimrl import FastLanguageModel, PatchFastRL
    PatchFastRL("grpo", FastLanguageModel)
"""

from slimrl.models import FastLanguageModel
from slimrl.patching import PatchFastRL, unpatch
from slimrl.sampling import vLLMSamplingParams
from slimrl.verify import verify  # `slimrl.verify(...)`: the patch proven exact on your setup (slimrl verify)

__all__ = ["FastLanguageModel", "PatchFastRL", "unpatch", "vLLMSamplingParams", "verify"]
__version__ = "0.1.0"
