"""The talking-head pipeline: a motion DiT, a super-resolution transformer and a VAE decoder.

Importing this package imports no torch: ``model.config``, ``model.noise``, ``model.chunks`` and
``model.errors`` are torch-free and are read by the runtime loader. The stage modules
(``model.dit``, ``model.sr``, ``model.vae``, ``model.pipeline``, ``model.weights``) import torch.
"""

from model.config import CONFIG_NAMES, PipelineConfig, get_config
from model.errors import ConfigError, ModelError, WeightsError

__all__ = ["CONFIG_NAMES", "ConfigError", "ModelError", "PipelineConfig", "WeightsError", "get_config"]
