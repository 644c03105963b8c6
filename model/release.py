"""The bundled talking-head pipeline as the toolchain sees it: the entry ``manifests/pipelines/*.toml`` name.

Everything the toolchain knows about this model comes through ``pipeline`` below and the
contract it satisfies (``avatar_release.pipeline``, docs/reference/pipeline-contract.md): its configs, its
three stages and their signatures, how a chunk flows, its weights, the kernels it routes its
attention to on each target, the levers the similarity band may judge, and its own analyses.

Importing this module imports no torch: the stage modules are imported when a module tree is
first built (a build machine always has torch; ``analyze`` of floors and config listing do not
need it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from avatar_release.pipeline import (
    Analysis,
    AnalysisContext,
    Delivery,
    GateRequests,
    Lever,
    Pipeline,
    RequestInput,
    RequestProgram,
    StageSignature,
    TargetContext,
    TensorSpec,
)
from model.config import CONFIG_NAMES, STAGES, PipelineConfig, get_config

__all__ = ["pipeline", "LEVERS", "BAND_VARIANTS"]

# Config overrides that may change the output within the measured similarity band (tier 2)
# instead of bit for bit. Any other difference from the baseline keeps a build at tier 1.
LEVERS = {
    "matmul_k_split": Lever("reassociation", "K-tiled matmuls: float32 partial products summed in another order"),
    "residual_dtype": Lever("precision", "the write-up's rejected lever: DiT/SR residual stream in bf16"),
    "attention_kernel": Lever(
        "reassociation", "Pallas attention kernels: the softmax sums run block by block (and with a fixed bound)"
    ),
    "dit.attention": Lever(
        "reassociation",
        "flash kernel for the DiT's attention: the softmax sums run key block "
        "by key block with a rescaled float32 accumulator",
    ),
    "vae.weights": Lever(
        "reassociation",
        "the decoder's weights replicated, each device decoding its own frames: "
        "XLA:CPU sums a whole convolution in another order than one split over output channels "
        "(tiny: 1 level in about 0.5% of values)",
    ),
    "vae.norm_stats": Lever(
        "reassociation",
        "the decoder's GroupNorm statistics from per-channel means (no reshape "
        "of the full-size activation): the same two-pass mean and variance summed in another order",
    ),
    "fused_preattn": Lever(
        "reassociation",
        "fused pre-attention kernel: the qkv dot as one bf16 x bf16 -> f32 dot instead of the model's f32 form",
    ),
    "ulysses_groups": Lever(
        "reassociation",
        "G = 1 is the GSPMD path, G > 1 the shard_map path (a differently fused "
        "softmax); between G > 1 values per-head math is bit-exact (tests/kernels/test_ulysses.py)",
    ),
    "sr.ulysses_groups": Lever(
        "reassociation", "the SR attention's own head-group count: as ulysses_groups, for the SR alone"
    ),
    "scan_layers": Lever(
        "reassociation",
        "blocks as one lax.scan over stacked weights: the same per-block math, "
        "fused differently (tiny: 2.4% of pixels off by one level)",
    ),
}

# What `gate calibrate` measures the band from: the same model with every matmul's contraction
# split in 2 and in 4 float32 partial sums (bf16 reassociation alone).
BAND_VARIANTS = ({"matmul_k_split": "2"}, {"matmul_k_split": "4"})


def _create(config: PipelineConfig) -> Any:
    from model.pipeline import AvatarPipeline

    return AvatarPipeline(config)


def _init_weights(config: PipelineConfig, seed: int) -> Any:
    from model.weights import init_pipeline

    return init_pipeline(config, seed)


def _load_weights(config: PipelineConfig, path: str) -> Any:
    from model.weights import load_weights

    return load_weights(config, path)


def _stage(tree: Any, name: str) -> Any:
    from model.pipeline import stage_module

    return stage_module(tree, name)


def _signature(config: PipelineConfig, frames: int) -> dict[str, StageSignature]:
    from model.pipeline import stage_inputs, stage_outputs

    ins, outs = stage_inputs(config, frames), stage_outputs(config, frames)
    return {
        s: StageSignature(tuple(TensorSpec(*t) for t in ins[s]), tuple(TensorSpec(*t) for t in outs[s])) for s in STAGES
    }


def _chunk_program(config: PipelineConfig) -> RequestProgram:
    # A talking head: the photo and the speech track in (the audio's layout: samples_per_frame
    # samples at sample_rate per frame), the chunk's noise from the request seed, the state carried
    # to the next chunk (chunk k+1 starts where chunk k ended) and the uint8 frames delivered, by
    # the names of stage_inputs / stage_outputs.
    return RequestProgram(
        inputs=(
            RequestInput.image("image", height=config.height, width=config.width),
            RequestInput.audio("audio", sample_rate=config.sample_rate, samples_per_frame=config.samples_per_frame),
            RequestInput.noise("noise"),
        ),
        delivers=Delivery.video("frames", height=config.height, width=config.width),
        fps=config.fps,
        carry={"prev_latent": "last_latent"},
    )


@contextlib.contextmanager
def _trace_context(config: PipelineConfig, target: TargetContext) -> Iterator[None]:
    """The model chooses its kernels: its attention call routed for the target while a stage traces."""
    from model.routing import AttentionRoute, head_sharded_attention

    route = AttentionRoute.from_config(config, platform=target.platform, kernel_flags=dict(target.kernel_flags))
    with head_sharded_attention(target.mesh, target.axis, route, declare=target.declare_route):
        yield


def _attention(ctx: AnalysisContext) -> dict:
    from model.analyze import analyze_attention

    return analyze_attention(
        ctx.spec.name,
        eligibility=not ctx.options.get("no_eligibility", False),
        collectives=not ctx.options.get("no_collectives", False),
    )


def _attention_text(r: dict) -> str:
    from model.analyze import attention_text

    return attention_text(r)


def _schedule(ctx: AnalysisContext) -> dict:
    from model.schedule import probe_schedule

    groups = tuple(ctx.options.get("groups", (1, 2, 4)))
    probes = probe_schedule(ctx.spec.name, ctx.target.name, groups, progress=ctx.progress)
    return {"pipeline": ctx.spec.name, "target": ctx.target.name, "probes": [p.to_json() for p in probes]}


def _schedule_text(r: dict) -> str:
    from model.schedule import schedule_text

    return schedule_text(r)


def _floors(ctx: AnalysisContext) -> dict:
    """The analytic floors of a compiled build's config per bucket (``analyze build`` sets them beside
    what XLA counted). Options: config_doc (the manifest's config), buckets {name: frames}, peak,
    bandwidth, chips."""
    from model.shapes import stage_floors

    o = ctx.options
    config = PipelineConfig.from_dict(dict(o["config_doc"]))
    return {
        bucket: {
            f.stage: {**f.to_json(), "flops_per_chip": f.flops / o["chips"]}
            for f in stage_floors(config, frames, o["peak"], o["bandwidth"], o["chips"])
        }
        for bucket, frames in o["buckets"].items()
    }


pipeline = Pipeline(
    name="avatar",
    stages=STAGES,
    configs={name: (lambda name=name: get_config(name)) for name in CONFIG_NAMES},
    create=_create,
    init_weights=_init_weights,
    load_weights=_load_weights,
    stage=_stage,
    signature=_signature,
    chunk_program=_chunk_program,
    trace_context=_trace_context,
    levers=LEVERS,
    band_variants=BAND_VARIANTS,
    gate_requests=GateRequests(images=(0, 1), audio=(0, 1), seed=0),
    analyses={
        "attention": Analysis(
            _attention,
            "Mask live fraction, block counts (128 tiles vs aligned), bounded-softmax "
            "eligibility, all-to-all bytes of the SR attention",
            text=_attention_text,
        ),
        "schedule": Analysis(
            _schedule,
            "Hidden vs exposed all-to-alls of one SR attention layer compiled for the target, per head-group count",
            text=_schedule_text,
            needs_target=True,
        ),
        "floors": Analysis(_floors, "Analytic flops, bytes and time floors per stage of a build's config"),
    },
    source_packages=("model", "kernels"),
)
