"""Former home of the OCI backend; it now lives in :mod:`avatar_release.registry.oci`.

Kept so that ``from avatar_release.registry._oci import OciRegistry, RetryPolicy, parse_oci_uri``
keeps working.
"""

from .oci import OciLocation, OciRegistry, RetryPolicy, parse_oci_uri

__all__ = ["OciRegistry", "OciLocation", "RetryPolicy", "parse_oci_uri"]
