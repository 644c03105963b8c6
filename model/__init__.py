"""The talking-head pipeline: a motion DiT, a super-resolution transformer and a VAE decoder.

Build machines only: the compiler traces these modules; the runtime loader and the serving pod
never import them (a gate worker checks). Importing this package imports no torch: ``config``,
``noise``, ``chunks`` and ``errors`` are torch-free; the stage modules (``dit``, ``sr``, ``vae``,
``pipeline``, ``weights``) import torch.
"""

from model.config import CONFIG_NAMES, PipelineConfig, get_config
from model.errors import ConfigError, ModelError, WeightsError

__all__ = ["CONFIG_NAMES", "ConfigError", "ModelError", "PipelineConfig", "WeightsError", "get_config"]
