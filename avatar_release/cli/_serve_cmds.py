"""Commands that run a build as a pod does: render, serve."""

from __future__ import annotations

import functools
import importlib
import json
import sys
from typing import Literal

import click

from .._progress import counted
from ..errors import InputError, NotFoundError
from ..registry import open_registry, with_node_cache
from ..runtime import TrustConfig
from ..serving import Pod, start_pod  # the rest of serving (the HTTP stack) once it is needed
from ._app import _T0, _emit, _progress, cli, json_option
from ._cache_options import cache_options
from ._devices import prepare_devices_for_build, trust_config, trust_options
from ._options import complete_ref, nonempty_ref, registry_option


def _one_ref(ref: str | None, **options: str | None) -> str | None:
    """The one reference given, as REF or as one of the options (``--channel``, ``--build``)."""
    given = {f"REF {ref!r}": ref} if ref else {}
    given |= {f"--{k} {v!r}": v for k, v in options.items() if v}
    if len(given) > 1:
        raise InputError(
            f"give one build reference, not {len(given)}: {', '.join(given)}; e.g. "
            f"`avatar-release {click.get_current_context().info_name} dev`"
        )
    return next(iter(given.values()), None)


def _named_inputs(given: tuple[str, ...]) -> dict[str, object]:
    """``--input NAME=VALUE`` options as {NAME: VALUE}: parsed as options are (before the registry is
    looked up), so a malformed one is a usage error first."""
    out: dict[str, object] = {}
    for item in given:
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise InputError(
                f"--input {item!r}: expected NAME=VALUE (a text input's text, or a tensor input's .npy file)"
            )
        out[name] = value
    return out


# ---------------------------------------------------------------------------------- render
@cli.command("render")
@click.argument("ref", required=False, metavar="[REF]", shell_complete=complete_ref, callback=nonempty_ref)
@click.option("--channel", default=None, help="Render the build a channel points at (same as REF).")
@click.option("--build", "build_ref", default=None, help="Render a build id or digest (same as REF).")
@click.option(
    "--image",
    "image_path",
    default=None,
    help="The build's image input: JPEG, PNG or WebP (or a .npy uint8 array); default: the sample "
    "picture (the sample face, for a talking head); zeros if the input is optional.",
)
@click.option(
    "--audio",
    "audio_path",
    default=None,
    help="The build's audio input: WAV, MP3, M4A/AAC, FLAC, Ogg/Opus or WebM; default: the sample clip "
    "of --seconds; silence if the input is optional.",
)
@click.option(
    "--input",
    "values",
    multiple=True,
    metavar="NAME=VALUE",
    callback=lambda ctx, p, v: _named_inputs(v),
    help="A text input's text, or a tensor input's .npy file, by the input's name (repeatable).",
)
@click.option(
    "--fit",
    type=click.Choice(["cover", "contain", "exact"]),
    default="cover",
    show_default=True,
    help="How a picture of another size meets the pipeline's: cover = scale and centre-crop, "
    "contain = scale to fit and letterbox on black, exact = refuse another size.",
)
@click.option(
    "--seconds",
    default=1.0,
    show_default=True,
    help="Length of the default sample audio; of the video, for a build with no audio input.",
)
@click.option(
    "--max-audio-seconds",
    default=4 * 3600.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Refuse a speech track longer than this (from its header, before anything loads; "
    "exactly, while decoding). Memory does not grow with the track: it is streamed.",
)
@click.option("--seed", default=0, show_default=True)
@click.option("--out", "out_path", default="out.mp4", show_default=True, help="H.264 mp4 with the audio muxed in.")
@click.option("--frames-dir", default=None, help="Also write every frame as PNG here.")
@trust_options
@cache_options
@registry_option
@json_option
def render_cmd(
    ref: str | None,
    channel: str | None,
    build_ref: str | None,
    image_path: str | None,
    audio_path: str | None,
    values: dict[str, object],
    fit: Literal["cover", "contain", "exact"],
    seconds: float,
    max_audio_seconds: float,
    seed: int,
    out_path: str,
    frames_dir: str | None,
    trust_key: str | None,
    trust_state: str | None,
    allow_stale: bool,
    max_timestamp_hours: float,
    trust_root: str | None,
    serve_expired: bool,
    registry_uri: str | None,
    as_json: bool,
) -> None:
    """Load build REF (a channel, build id or digest; default dev) as a serving pod would and render a
    video with zero compiles."""
    from ..serving import render_to_files

    chosen = _one_ref(ref, channel=channel, build=build_ref) or "dev"
    trusted = trust_config(trust_key, trust_state, allow_stale, max_timestamp_hours, trust_root, serve_expired)
    summary = render_to_files(
        ref=chosen,
        registry_uri=registry_uri,
        image_path=image_path,
        audio_path=audio_path,
        seconds=seconds,
        seed=seed,
        out_path=out_path,
        frames_dir=frames_dir,
        prepare=functools.partial(prepare_devices_for_build, trust=trusted),
        t_process=_T0,
        trust=trusted,
        fit=fit,
        max_audio_seconds=max_audio_seconds,
        progress=_progress(),
        values=values,
    )
    human = (
        f"rendered {counted(summary['frames'], 'frame')} in {counted(summary['chunks'], 'chunk')} from "
        f"{summary['build_id']} -> "
        f"{summary['out']}\n  compiles {summary['compiles']}, cold start {summary['cold_start']['total']:.2f}s "
        f"(first chunk {summary['cold_start']['first_chunk']:.2f}s)\n  {summary['pace']['summary']}"
    )
    if f := summary["inputs"]["image"].get("fit"):
        human += (
            f"\n  image {f['source_format']} {'x'.join(map(str, f['source_size']))} -> "
            f"{'x'.join(map(str, f['target_size']))} by --fit {f['rule']}, source box {f['box']}"
        )
    _emit(as_json, {"ok": True, **summary}, human)


# ---------------------------------------------------------------------------------- serve
@cli.command("serve")
@click.argument("ref", required=False, metavar="[REF]", shell_complete=complete_ref, callback=nonempty_ref)
@click.option("--channel", default=None, help="Channel (or build id / digest) to serve (same as REF).")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    envvar="AVATAR_RELEASE_HOST",
    help="Address to bind (env AVATAR_RELEASE_HOST); 0.0.0.0 in a container.",
)
@click.option(
    "--port",
    default=8080,
    show_default=True,
    envvar="AVATAR_RELEASE_PORT",
    help="0 picks a free port (printed when ready); env AVATAR_RELEASE_PORT.",
)
@click.option(
    "--queue",
    default=4,
    show_default=True,
    type=click.IntRange(0, 1000),
    help="Renders that may wait behind the running one; past it, 429 with Retry-After.",
)
@click.option(
    "--max-body",
    default=32 * 1024 * 1024,
    show_default=True,
    type=click.IntRange(1024, 1 << 30),
    help="Largest request body in bytes (413 past it).",
)
@click.option(
    "--max-seconds",
    default=60.0,
    show_default=True,
    type=click.FloatRange(0.1, 1800),
    help="Longest video one request may ask for (400 past it), counted in the build's frames.",
)
@click.option(
    "--request-timeout",
    default=300.0,
    show_default=True,
    type=click.FloatRange(1, 86400),
    help="Admission to last byte; past it the render stops.",
)
@click.option(
    "--header-timeout",
    default=10.0,
    show_default=True,
    type=click.FloatRange(0.1, 600),
    help="Seconds for a request's headers to arrive; a slower connection is closed (slowloris).",
)
@click.option(
    "--grace",
    default=30.0,
    show_default=True,
    type=click.FloatRange(0, 3600),
    help="Seconds in-flight renders get to finish after SIGTERM.",
)
@click.option(
    "--probe-port",
    default=None,
    type=click.IntRange(-1, 65535),
    envvar="AVATAR_RELEASE_PROBE_PORT",
    help="Also answer /livez and /readyz on this port, a listener of their own that no connection flood "
    "of the render port can starve (point the kubelet at it). Default: --port + 1 (a free port "
    "with --port 0); -1: none.",
)
@click.option(
    "--max-connections-per-client",
    default=16,
    show_default=True,
    type=click.IntRange(0, 100000),
    help="Open connections one client address may hold on the render port (429 past it; 0: no cap).",
)
@click.option(
    "--follow",
    is_flag=True,
    help="Follow the channel: load, warm and swap in the build it moves to "
    "(also on SIGHUP); a build that fails verification or compiles is refused.",
)
@click.option(
    "--poll",
    default=30.0,
    show_default=True,
    type=click.FloatRange(0.05, 86400),
    help="Seconds between channel checks with --follow.",
)
@trust_options
@cache_options
@registry_option
def serve_cmd(
    ref: str | None,
    channel: str | None,
    host: str,
    port: int,
    queue: int,
    max_body: int,
    max_seconds: float,
    request_timeout: float,
    header_timeout: float,
    grace: float,
    probe_port: int | None,
    max_connections_per_client: int,
    follow: bool,
    poll: float,
    trust_key: str | None,
    trust_state: str | None,
    allow_stale: bool,
    max_timestamp_hours: float,
    trust_root: str | None,
    serve_expired: bool,
    registry_uri: str | None,
) -> None:
    """Serve REF (a channel, build id or digest; default prod) over HTTP (streamed fMP4); ready only after
    verify + load + one warm chunk with 0 compiles."""
    chosen = _one_ref(ref, channel=channel) or "prod"
    trusted = trust_config(trust_key, trust_state, allow_stale, max_timestamp_hours, trust_root, serve_expired)
    pod = _start_serving(registry_uri, chosen, trusted)
    from ..serving import AppConfig, Limits, ServerConfig, run_server  # imported while the build loaded

    if probe_port is None:
        probe_port = port + 1 if port else 0
    cfg = ServerConfig(
        host=host,
        port=port,
        grace=grace,
        follow=follow,
        poll=poll,
        header_timeout=header_timeout,
        probe_port=None if probe_port == -1 else probe_port,
        max_connections_per_client=max_connections_per_client,
        app=AppConfig(
            limits=Limits(max_body=max_body, max_seconds=max_seconds), queue=queue, request_timeout=request_timeout
        ),
    )
    run_server(pod, cfg, functools.partial(_say_ready, pod))


def _start_serving(registry_uri: str | None, chosen: str, trusted: TrustConfig | None) -> Pod:
    """The pod ``serve`` runs, ready (verified, loaded, warm); a channel that holds no build says
    which channels do and how to serve one of them."""
    try:
        return start_pod(
            with_node_cache(open_registry(registry_uri, create=False)),
            chosen,
            trust=trusted,
            prepare=functools.partial(prepare_devices_for_build, trust=trusted),
            beside=_server_imports,
        )
    except NotFoundError as e:
        held = e.details.get("channels_holding") or {}
        if e.details.get("empty_channel") == chosen and held:
            raise NotFoundError(
                f"{e}; serve one of those with `avatar-release serve {next(iter(held))}`, or promote "
                f"a build to {chosen} first"
            ).with_details(**e.details) from None
        raise


def _server_imports() -> None:
    """The HTTP server's modules (starlette, uvicorn, the app), imported on a thread of their own while
    the pod's build loads (``start_pod(beside=...)``), not before JAX starts."""
    for module in ("avatar_release.serving._lifecycle", "avatar_release.serving._request", "uvicorn"):
        importlib.import_module(module)


def _say_ready(pod: Pod, addr: tuple[str, int], probe_addr: tuple[str, int] | None) -> None:
    """The line ``serve`` prints once it listens: its addresses and the pod's health, as JSON."""
    click.echo(
        json.dumps(
            {
                "event": "ready",
                "host": addr[0],
                "port": addr[1],
                "probe_port": probe_addr[1] if probe_addr else None,
                **pod.health(),
            }
        ),
        nl=True,
    )
    sys.stdout.flush()
