"""The model package's exceptions (torch-free).

ModelError
  ConfigError(ValueError)    a config violates a shape constraint, or names no known config
  WeightsError(ValueError)   a weights file is missing, unreadable, or does not fit the config
"""


class ModelError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(ModelError, ValueError):
    """A pipeline config is unknown or violates a constraint; the message names the field."""


class WeightsError(ModelError, ValueError):
    """A weights file cannot be used; the message names the file and, where one is at fault, the tensor."""
