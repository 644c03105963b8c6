"""An output class written the way transformers' ``ModelOutput`` and diffusers' ``BaseOutput`` are
built: a dataclass subclassing ``OrderedDict``, its set fields also its items, registered as a node
of torch's pytree. ``EncodeOutput`` has the shape of diffusers' ``UNet2DOutput``: one field, ``sample``.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch.utils._pytree as pytree


class ModelOutput(OrderedDict):
    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        pytree.register_pytree_node(
            cls,
            lambda out: (list(out.values()), list(out.keys())),
            lambda values, keys: cls(**dict(zip(keys, values))),
        )

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None:
                self[f.name] = value


@dataclass
class EncodeOutput(ModelOutput):
    sample: Any = None
