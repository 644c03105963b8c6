"""The band's commands in the ``gate`` group: ``gate calibrate`` measures a similarity band, ``gate
inputs`` lists the digests of the files that decide verdicts (bands, target specs, the lever list)
for a trust policy to pin."""

from __future__ import annotations

import click

from ..compile import parse_set_args
from ..gates import calibrate
from ..gates.inputs import gate_input_files, gate_inputs_toml
from ..machine import native_log_filter
from ..registry import open_registry
from ..trust.policy import load_policy
from ._app import _emit, _progress, json_option
from ._devices import prepare_devices_for_target
from ._exit_codes import ExitCodesCommand
from ._options import new_registry_option, project_option

__all__ = ["gate_calibrate_cmd", "gate_inputs_cmd"]


@click.command("calibrate", cls=ExitCodesCommand)
@click.option("--pipeline", default="tiny", show_default=True)
@click.option("--target", default="cpu-8", show_default=True)
@click.option(
    "--variant",
    "variants",
    multiple=True,
    metavar="KEY=VALUE[,KEY=VALUE]",
    help="A mathematically equivalent reduction order (repeatable; default: the pipeline's band_variants).",
)
@click.option(
    "--margin-db", default=0.25, show_default=True, type=float, help="Subtracted from the lowest measured PSNR."
)
@click.option("--out", default=None, help="Band file to write (default: manifests/bands/<pipeline>-<target>.json).")
@click.option(
    "--fresh-reference",
    is_flag=True,
    help="Render the reference twice even where its signed passing gate verdict (this gate set, a machine "
    "like this one) holds its frames.",
)
@new_registry_option
@project_option
@json_option
def gate_calibrate_cmd(
    pipeline: str,
    target: str,
    variants: tuple[str, ...],
    margin_db: float,
    out: str | None,
    fresh_reference: bool,
    registry_uri: str | None,
    as_json: bool,
) -> None:
    """Measure the similarity band that bf16 reassociation alone produces, and store it.

    The reference is rendered twice in fresh processes (it must be deterministic), unless its own
    signed passing gate verdict on the same gate set, from a machine like this one, already holds
    those two renders and their frames: then the variants alone are rendered."""
    parsed = [parse_set_args([p for p in v.split(",") if p]) for v in variants] or None
    prepare_devices_for_target(target)
    registry = open_registry(registry_uri)

    with native_log_filter():  # the variants' compiles: C++ log as readable lines
        res = calibrate(
            pipeline,
            target,
            registry=registry,
            variants=parsed,
            margin_db=margin_db,
            out=out,
            fresh_reference=fresh_reference,
            progress=_progress(),
        )
    b = res.band
    rows = "\n".join(
        f"  {v.overrides}: min PSNR {v.min_psnr_db} dB, median {v.median_psnr_db} dB, "
        f"max abs diff {v.max_abs_diff}, identical frames {v.identical_frames}/{v.frames}"
        for v in b.variants
    )
    _emit(
        as_json,
        {"ok": True, "path": str(res.path), "digest": res.digest, "band": b.model_dump(mode="json")},
        f"band for {pipeline} on {target}: PSNR >= {b.psnr_floor_db} dB, max abs diff <= "
        f"{b.max_abs_diff_ceiling}\n{rows}\n  written to {res.path}\n  digest {res.digest}: a trust policy that pins "
        "its bands ([gate_inputs]) must list it before a verdict judged by it promotes (`avatar-release gate inputs`)",
    )


@click.command("inputs", cls=ExitCodesCommand)
@click.option(
    "--band",
    "bands",
    multiple=True,
    metavar="FILE",
    help="Also list this band file (repeatable; default: manifests/bands/*.json).",
)
@project_option
@json_option
def gate_inputs_cmd(bands: tuple[str, ...], as_json: bool) -> None:
    """Print the digests of the bands, target specs and lever list in force, as a trust policy's
    [gate_inputs] section: pinned there, only these decide a verdict that promotes.

    Each line says whether the trust policy in force allows that file now; digests it allows that no
    file here has (an earlier band, kept for rollbacks) are kept in the section.
    """
    policy = load_policy()
    files = gate_input_files(bands)
    text = gate_inputs_toml(files, policy.gate_inputs, str(policy.path))
    _emit(
        as_json,
        {
            "ok": True,
            "policy": str(policy.path),
            "pinned": policy.gate_inputs.pinned,
            "files": [f.to_json(policy.gate_inputs) for f in files],
            "toml": text,
        },
        text.rstrip("\n"),
    )
