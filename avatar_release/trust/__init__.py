"""Trust: Ed25519 keys and signed promotion statements that serving pods verify before loading.

Nothing here runs at import; ``cryptography`` is imported only when a key is used.
"""

from .keys import generate_keypair, key_id, load_private_key, load_public_key
from .statements import AcceptedState, StatementPayload, read_statement, sign, verify

__all__ = [
    "generate_keypair",
    "key_id",
    "load_private_key",
    "load_public_key",
    "AcceptedState",
    "StatementPayload",
    "read_statement",
    "sign",
    "verify",
]
