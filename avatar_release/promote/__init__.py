"""Promotion: dev -> staging -> prod, only with passing gates; rollback; history.

Channel moves are compare-and-swap on the registry (exactly one of two concurrent moves wins)
with an append-only history. Nothing here runs at import.
"""

from .actions import MoveResult, actor, promote, publish_to_dev, rollback
from .policy import Decision, check_promotion, check_rollback_target

__all__ = [
    "promote",
    "publish_to_dev",
    "rollback",
    "MoveResult",
    "Decision",
    "check_promotion",
    "check_rollback_target",
    "actor",
]
