"""The one exception tree of avatar-release, and the exit code of each branch.

Every error the tool raises on purpose is an :class:`AvatarReleaseError`. Messages say
what went wrong, where, expected vs actual, and how to fix it. The CLI maps each class
to an exit code, so CI can tell "a gate or policy said no" (1) from "a person must look
first" (13, needs-review) from "bad input" (2) from "refused to load" (3-5) from "the
infrastructure broke" (6+).

    AvatarReleaseError                  exit 10  (base; never raised bare)
    ├── InputError                      exit 2   bad arguments, specs, files, overrides
    │   └── SpecError                   exit 2   a manifests/ file is wrong or missing
    ├── Refusal                         exit 1   a gate or a policy said no
    │   └── NeedsReview                 exit 13  the output is below the band: a blind review decides
    ├── NotFoundError                   exit 3   unknown build, channel or blob
    ├── IntegrityError                  exit 4   size / digest / format check failed
    │   └── TrustError                  exit 4   a signature or trust check refused
    ├── EnvironmentMismatch             exit 5   this machine is not what the build was made for
    ├── CompileError                    exit 6   tracing, lowering or XLA compilation failed
    ├── RegistryError                   exit 7   the store is unreachable, unwritable or locked
    │   └── ConflictError               exit 7   a concurrent writer won the race
    ├── RecompileError                  exit 8   the zero-compile guard saw a compile
    ├── MediaError                      exit 9   ffmpeg failed on already-validated input
    ├── SchemaVersionError              exit 11  a record written by a newer (or too old) avatar-release
    └── GateInfraError                  exit 12  a gate run could not complete (no verdict on the build)

Anything else escaping the CLI is a crash (exit 70).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # DoesNotFit carries a records.MemoryFit; records imports this module, so it is named here by its base.
    from pydantic import BaseModel

__all__ = [
    "AvatarReleaseError",
    "InputError",
    "SpecError",
    "Refusal",
    "NeedsReview",
    "Revoked",
    "NeedsApproval",
    "NotFoundError",
    "IntegrityError",
    "SchemaVersionError",
    "TrustError",
    "EnvironmentMismatch",
    "CompileError",
    "ContractError",
    "RegistryError",
    "ConflictError",
    "RecompileError",
    "DoesNotFit",
    "MediaError",
    "GateInfraError",
    "CRASH_EXIT_CODE",
]

CRASH_EXIT_CODE = 70


class AvatarReleaseError(Exception):
    """Base of every error avatar-release raises on purpose.

    ``details``: machine-readable evidence (a gate's result, the blobs that failed) that the
    CLI adds to its ``--json`` error document; set with :meth:`with_details`.
    """

    exit_code: int = 10
    details: dict = {}

    def with_details(self, **details: object) -> AvatarReleaseError:
        self.details = {**self.details, **details}
        return self


class InputError(AvatarReleaseError):
    """Bad input from the user: arguments, files, overrides. Fix the input and rerun."""

    exit_code = 2


class SpecError(InputError):
    """A declared spec under manifests/ (pipeline, target, flag profile) is missing or wrong."""


class ContractError(SpecError):
    """A pipeline's entry does not satisfy the pipeline contract (docs/reference/pipeline-contract.md)."""


class Refusal(AvatarReleaseError):
    """A gate or a promotion policy said no. Not a fault: the evidence is in the message."""

    exit_code = 1


class Revoked(Refusal):
    """The build carries a signed revocation: promotion, rollback and pods refuse it for good."""


class NeedsApproval(Refusal):
    """Prod needs a signed release approval by a second role, and none counts yet."""


class NeedsReview(Refusal):
    """The gate found the output below the similarity band: not a no, but not a yes until a blind
    review approves it. Its own exit code, so a pipeline can page a reviewer instead of failing."""

    exit_code = 13


class DoesNotFit(Refusal):
    """A build's per-device memory (XLA's memory_analysis) exceeds the target's capacity.

    ``fit`` is the MemoryFit record with the numbers; nothing was published.
    """

    def __init__(self, message: str, fit: BaseModel | None = None):
        super().__init__(message)
        self.fit = fit


class NotFoundError(AvatarReleaseError):
    """An unknown build, channel or blob."""

    exit_code = 3


class IntegrityError(AvatarReleaseError):
    """Stored bytes are not what their record says (size, digest, format)."""

    exit_code = 4


class TrustError(IntegrityError):
    """A signature check refused a build: unsigned, wrong key, tampered, wrong channel, expired
    or replayed. Nothing was unpickled."""


class SchemaVersionError(AvatarReleaseError):
    """A record was written with a schema version this tool does not read.

    Not an integrity fault: the bytes may be perfectly good, written by a newer (or much
    older) avatar-release. ``kind``, ``found`` and ``supported`` carry both sides.
    """

    exit_code = 11

    def __init__(
        self, message: str, *, kind: str = "", found: int | None = None, supported: tuple[int, int] | None = None
    ):
        super().__init__(message)
        self.kind = kind
        self.found = found
        self.supported = supported


class EnvironmentMismatch(AvatarReleaseError):
    """This machine differs from the one a build was compiled for.

    ``differences`` maps each differing field to ``(expected, actual)``.
    """

    exit_code = 5

    def __init__(self, message: str, differences: dict[str, tuple[object, object]] | None = None):
        super().__init__(message)
        self.differences = dict(differences or {})


class CompileError(AvatarReleaseError):
    """Tracing, lowering or XLA compilation failed (including rejected compiler options)."""

    exit_code = 6


class RegistryError(AvatarReleaseError):
    """The registry is unreachable, unwritable, or failed mid-operation."""

    exit_code = 7


class ConflictError(RegistryError):
    """Another writer moved the same channel first; nothing was changed by this call."""


class RecompileError(AvatarReleaseError):
    """The zero-compile guard saw XLA compile while serving.

    ``events`` lists what compiled (stage, shapes, seconds) as far as it is known.
    """

    exit_code = 8

    def __init__(self, message: str, events: list[dict] | None = None):
        super().__init__(message)
        self.events = list(events or [])


class MediaError(AvatarReleaseError):
    """ffmpeg failed (missing, crashed, refused an encoder) on input already validated."""

    exit_code = 9


class GateInfraError(AvatarReleaseError):
    """A gate run could not complete: its fresh process crashed, timed out, or saw another
    environment or gate set than the gate. Not a verdict on the build (that is a Refusal, or a
    failed gate result); rerun the gate once the cause in the message is fixed."""

    exit_code = 12
