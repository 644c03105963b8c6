"""avatar-release: compiled XLA programs as release artifacts.

Importing this package has no side effects: it neither imports JAX nor touches XLA flags.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
