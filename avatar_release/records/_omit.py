"""A serializer for fields added to a stored record after it was first stored: left out while they
are None, so an older record written again keeps its bytes (and every digest taken over them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, SerializerFunctionWrapHandler, model_serializer

__all__ = ["_omit_when_none"]


def _omit_when_none(*names: str) -> Callable[[BaseModel, SerializerFunctionWrapHandler], dict[str, Any]]:
    """A serializer leaving out ``names`` while they are None: fields added to a record after
    it was first stored, so that an older record written again keeps its bytes (and every digest
    taken over them: content digest, identity)."""

    def omit(self: BaseModel, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        for name in names:
            if data.get(name, 0) is None:
                del data[name]
        return data

    return model_serializer(mode="wrap")(omit)
