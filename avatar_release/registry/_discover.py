"""Which registry a command uses, found as git finds a repository.

In order: ``--registry`` (a URI, a path, or a name from a config file), then
``$AVATAR_RELEASE_REGISTRY`` (the same forms), then the ``default`` of the nearest project config
file (``avatar-release.toml`` in this directory or one above), then that of the user config file
(``$AVATAR_RELEASE_CONFIG``, else ``config.toml`` in the user's config directory:
``$AVATAR_RELEASE_CONFIG_DIR``, ``$XDG_CONFIG_HOME/avatar-release`` or ``~/.config/avatar-release``), then the nearest ``.avatar-release/`` directory holding
builds, upward from here. A command that creates a registry (``compile``) falls back to
``./.avatar-release``; any other says where it looked and how to make one.

A config file::

    default = "team"

    [registries.local]
    uri = ".avatar-release"            # a path is relative to the file's directory

    [registries.team]
    uri = "oci+https://registry.example.com/avatar"
    ca = "certs/team-ca.pem"           # optional: the CA bundle for HTTPS (relative to the file)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import Field, field_validator

from .._config_files import ConfigModel, parse_model, read_toml
from .._paths import config_dir
from .._suggest import did_you_mean
from ..errors import InputError, NotFoundError

__all__ = [
    "RegistryChoice",
    "RegistryConfig",
    "NamedRegistry",
    "find_registry",
    "load_config",
    "config_files",
    "PROJECT_CONFIG",
    "DEFAULT_DIR",
    "ENV_REGISTRY",
    "ENV_CONFIG",
]

PROJECT_CONFIG = "avatar-release.toml"
DEFAULT_DIR = ".avatar-release"
ENV_REGISTRY = "AVATAR_RELEASE_REGISTRY"
ENV_CONFIG = "AVATAR_RELEASE_CONFIG"
_SCHEMES = ("oci://", "oci+http://", "oci+https://", "gar://", "memory://", "file://")


@dataclass(frozen=True)
class NamedRegistry:
    """One ``[registries.NAME]`` table: its URI made absolute against the file that names it."""

    name: str
    uri: str
    source: Path


@dataclass(frozen=True)
class RegistryConfig:
    """One config file: its named registries and the name it makes the default (if any)."""

    path: Path
    default: str | None = None
    registries: dict[str, NamedRegistry] = field(default_factory=dict)


@dataclass(frozen=True)
class RegistryChoice:
    """The registry a command will use, why (``source``), and every place that was consulted."""

    uri: str
    source: str
    name: str | None = None
    looked: tuple[str, ...] = ()
    found: bool = True

    def to_dict(self) -> dict[str, object]:
        return {
            "uri": self.uri,
            "source": self.source,
            "name": self.name,
            "looked": list(self.looked),
            "found": self.found,
        }


def _is_uri(value: str) -> bool:
    return "://" in value


class RegistryEntry(ConfigModel):
    """One ``[registries.NAME]`` table as written."""

    uri: str = Field(description="a path (relative to the file), oci://HOST/REPO, oci+https://..., gar://...")
    ca: str | None = Field(None, description="the CA bundle for HTTPS, relative to the file (oci:// only)")

    @field_validator("uri")
    @classmethod
    def _non_empty(cls, v: str) -> str:
        if not v:
            raise ValueError("expected a non-empty string (a path, oci://HOST/REPO, gar://...)")
        return v


class RegistryConfigFile(ConfigModel):
    """A registry config file as written (``avatar-release.toml`` or the user's ``config.toml``)."""

    default: str | None = Field(None, description="the name of a [registries.NAME] table")
    registries: dict[str, RegistryEntry] = Field({}, description="[registries.NAME] tables")


def _entry_uri(name: str, entry: RegistryEntry, path: Path) -> str:
    where = f"{path}: [registries.{name}]"
    uri, ca, base = entry.uri, entry.ca, path.parent
    if uri.startswith("file://"):
        uri = "file://" + str((base / uri.removeprefix("file://")).absolute())
    elif not _is_uri(uri):
        uri = str((base / os.path.expanduser(uri)).absolute())
    if ca:
        if not uri.startswith(("oci://", "oci+http://", "oci+https://")):
            raise InputError(f"{where}: ca applies to oci:// registries only (uri is {uri!r})")
        if "?" in uri:
            raise InputError(f"{where}: give the CA either as ca = or as ?ca= in the uri, not both")
        uri += "?ca=" + str((base / os.path.expanduser(ca)).absolute())
    return uri


def load_config(path: Path) -> RegistryConfig:
    """Parse one config file; a malformed one is an InputError naming the file, key and fix."""
    fix = "see `avatar-release registries --help` for the format"
    doc = read_toml(path, what="registry config", error=InputError, footer=fix)
    data = parse_model(RegistryConfigFile, doc, where=f"registry config {path}", error=InputError, footer=fix)
    named = {n: NamedRegistry(n, _entry_uri(n, t, path), path) for n, t in data.registries.items()}
    if data.default is not None and data.default not in named:
        raise InputError(
            f"{path}: default = {data.default!r} names no [registries.{data.default}] table"
            f"{did_you_mean(data.default, named)}; defined: {', '.join(sorted(named)) or 'none'}"
        )
    return RegistryConfig(path, data.default, named)


def _user_config(environ: Mapping[str, str]) -> Path:
    if environ.get(ENV_CONFIG):
        return Path(os.path.expanduser(environ[ENV_CONFIG]))
    return config_dir(environ) / "config.toml"


def _upward(start: Path) -> list[Path]:
    start = start.absolute()
    return [start, *start.parents]


def config_files(cwd: Path, environ: Mapping[str, str]) -> list[Path]:
    """The config files that exist, nearest first: the project's (upward from ``cwd``), then the user's."""
    out = [d / PROJECT_CONFIG for d in _upward(cwd) if (d / PROJECT_CONFIG).is_file()][:1]
    user = _user_config(environ)
    if user.is_file() and user not in out:
        out.append(user)
    return out


def _by_name(value: str, configs: list[RegistryConfig]) -> NamedRegistry | None:
    for c in configs:
        if value in c.registries:
            return c.registries[value]
    return None


def _explicit(
    value: str, how: str, configs: list[RegistryConfig], *, create: bool, cwd: Path, looked: list[str]
) -> RegistryChoice:
    """``--registry`` / ``$AVATAR_RELEASE_REGISTRY``: a URI, a configured name, or a path."""
    if _is_uri(value):
        return RegistryChoice(value, how, looked=tuple(looked))
    named = _by_name(value, configs)
    if named is not None:
        return RegistryChoice(named.uri, f"{how} names [registries.{value}] in {named.source}", value, tuple(looked))
    path = (cwd / os.path.expanduser(value)).absolute()
    if create or (path / "builds").is_dir() or "/" in value or value.startswith("."):
        return RegistryChoice(str(path), how, looked=tuple(looked))
    names = sorted({n for c in configs for n in c.registries})
    raise NotFoundError(
        f"registry {value!r} ({how}): no [registries.{value}] in the config files and no registry directory "
        f"{path}{did_you_mean(value, names)}; configured names: {', '.join(names) or 'none'} "
        f"(config files: {', '.join(str(c.path) for c in configs) or 'none found'})"
    ).with_details(looked=looked + [f"{how}: {value}"])


def _compile_here(here: Path, env: Mapping[str, str]) -> str:
    """The compile that makes a registry in ``here``: it needs a project (manifests/), so outside
    one (none upward, no $AVATAR_RELEASE_PROJECT) the command names ``--project DIR``."""
    if env.get("AVATAR_RELEASE_PROJECT") or any((d / "manifests").is_dir() for d in _upward(here)):
        return "`avatar-release compile --pipeline PIPELINE --target TARGET`"
    return (
        "`avatar-release compile --project DIR --pipeline PIPELINE --target TARGET` (DIR: the project, the "
        "directory holding manifests/; none is here or above)"
    )


def find_registry(
    explicit: str | None = None,
    *,
    create: bool = False,
    cwd: Path | None = None,
    environ: Mapping[str, str] | None = None,
    configs: list[RegistryConfig] | None = None,
) -> RegistryChoice:
    """The registry to use (see the module's docstring for the order).

    With ``create`` (a command that may make a new local registry), nothing found means
    ``./.avatar-release``; without, it is a NotFoundError (exit 3) listing every place looked.
    """
    env = os.environ if environ is None else environ
    here = Path.cwd() if cwd is None else cwd
    if configs is None:  # (a caller that already read the config files passes them)
        configs = [load_config(p) for p in config_files(here, env)]
    if explicit:
        return _explicit(explicit, "--registry", configs, create=create, cwd=here, looked=[])
    looked = ["--registry: not given"]
    if env.get(ENV_REGISTRY):
        return _explicit(env[ENV_REGISTRY], f"${ENV_REGISTRY}", configs, create=create, cwd=here, looked=looked)
    looked.append(f"${ENV_REGISTRY}: not set")
    for c in configs:
        if c.default:
            entry = c.registries[c.default]
            return RegistryChoice(entry.uri, f"default = {c.default!r} in {c.path}", c.default, tuple(looked))
        looked.append(f"{c.path}: no default")
    if not configs:
        looked.append(f"config files: none ({PROJECT_CONFIG} here or above {here}; {_user_config(env)})")
    for d in _upward(here):
        if (d / DEFAULT_DIR / "builds").is_dir():
            return RegistryChoice(str(d / DEFAULT_DIR), f"nearest {DEFAULT_DIR}/ upward (in {d})", looked=tuple(looked))
    looked.append(f"{DEFAULT_DIR}/ with builds: none in {here.absolute()} or any directory above")
    fallback = str(here.absolute() / DEFAULT_DIR)
    if create:
        return RegistryChoice(
            fallback, f"none found: a new one in {here.absolute()}", looked=tuple(looked), found=False
        )
    raise NotFoundError(
        "no registry found. Looked at:\n"
        + "".join(f"  - {w}\n" for w in looked)
        + f"  fix: create one here with {_compile_here(here, env)}, pass "
        f"--registry PATH|URI|NAME, set ${ENV_REGISTRY}, or name a default in {PROJECT_CONFIG} "
        "(see `avatar-release registries --help`)"
    ).with_details(looked=looked)
