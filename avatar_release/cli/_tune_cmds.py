"""``avatar-release autotune``: a GPU build compiled again with measured autotune configs."""

from __future__ import annotations

import os
from pathlib import Path

import click

from ..compile import autotune_build, read_results
from ..machine import native_log_filter
from ..registry import open_registry, read_manifest
from ._app import _emit, _next_step, _progress, cli, json_option
from ._devices import prepare_devices_for_target
from ._options import complete_ref, nonempty_ref, project_option, registry_option


@cli.command("autotune")
@click.argument("ref", shell_complete=complete_ref, callback=nonempty_ref)
@click.option(
    "--results",
    "results_path",
    default=None,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Autotune results recorded on the build's GPUs (XLA's text form, e.g. an earlier run's "
    "--save-results): compile with them here instead of measuring.",
)
@click.option(
    "--save-results",
    "save_path",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the results compiled with to this file (to tune elsewhere with --results).",
)
@click.option(
    "--allow-incomplete",
    is_flag=True,
    help="Let XLA keep its default config where the results have none (recorded in the build) "
    "instead of refusing the compile.",
)
@registry_option
@project_option
@json_option
def autotune_cmd(
    ref: str,
    results_path: Path | None,
    save_path: Path | None,
    allow_incomplete: bool,
    registry_uri: str | None,
    as_json: bool,
) -> None:
    """Measure a GPU build's configs on its GPUs; publish it compiled with them as a new build.

    Without --results this host must have the build's GPUs: XLA measures each GEMM tiling,
    fusion tiling and convolution algorithm on them while compiling the build's source, and the
    build is compiled again requiring a result for every one of them, so a pod tunes nothing at
    start. The results are kept in the new build and its identity covers them. Dev is left alone.
    """
    reg = open_registry(registry_uri, create=False)
    _, m = read_manifest(reg, ref)
    results = None
    if results_path is not None:
        results = read_results(results_path.read_bytes(), where=f"--results {results_path}")
    else:
        # Measuring needs the GPUs themselves: leave JAX free to start its CUDA backend.
        os.environ.setdefault("JAX_PLATFORMS", "cuda,cpu")
    prepare_devices_for_target(m.target)
    with native_log_filter():
        report = autotune_build(
            ref,
            reg,
            results=results,
            require_complete=not allow_incomplete,
            save_results=save_path,
            progress=_progress(),
        )
    source = f"measured on {report.measured_on}" if report.measured_on else f"from {results_path}"
    before, after = report.convolutions_at_run_time
    state = "published" if report.created else "already published (identical build)"
    nxt = f"avatar-release gate {report.tuned_id}"
    _emit(
        as_json,
        {"ok": True, **report.to_json(), "next": nxt},
        f"{state}: {report.tuned_id}\n  tuned from {report.build_id}\n"
        f"  results {report.results.digest} ({report.results.entries} configs, {source}); "
        + (
            "XLA required a config for every instruction"
            if report.complete_required
            else "XLA's defaults where the results have none"
        )
        + f"\n  convolutions a pod would tune at start: {before} -> {after}\n"
        f"  dev unchanged   ({report.wall_seconds:.1f}s)\n{_next_step(nxt)}",
    )
