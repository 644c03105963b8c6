"""Production shapes on paper: parameters, tokens, and each stage's time floor per chunk.

Analytic, from the config alone (no compile, no torch): the numbers behind
``docs/concepts/production-shapes.md``. For one chunk of F frames and each stage (DiT, SR, VAE):

* **flops**: the matmul and convolution work of the whole mesh (2 flops per multiply-add), the
  sampler's steps included, attention counted over the live part of its mask only (a kernel that
  skips dead blocks and never materialises the scores, i.e. the best case);
* **minimum HBM bytes per chip**: every weight read at least once per pass by every chip (FSDP
  gathers each layer whole, and under Ulysses every chip applies every layer to its shard of
  the sequence), plus the activations that cannot stay on chip crossing HBM once each way,
  split over the mesh;
* **floors**: ``flops / (chips x peak flops)`` and ``bytes per chip / HBM bandwidth``; the larger
  binds. A stage cannot run faster than its floor on any schedule; real kernels run slower.
* **the gather floor**, reported beside them: FSDP keeps 1/chips of each weight per chip, so every
  pass brings the other (chips - 1)/chips of every weight in over the chip's ICI links. At most
  ``ICI_IN_BYTES_PER_SECOND`` arrive per chip; the write-up's gathers run on the SparseCore and
  hide behind compute, which they can only do where this floor is below the compute floor.

The parameter counts are exact: a unit test checks them against the models instantiated on
PyTorch's meta device.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from model.config import MESH_SIZE, PipelineConfig

__all__ = [
    "StageFloor",
    "ShapeReport",
    "ICI_IN_BYTES_PER_SECOND",
    "param_counts",
    "stage_floors",
    "shape_report",
    "report_for_pipeline",
]

_BF16, _F32 = 2, 4
# Cloud TPU v6e documentation: 800 GB/s of bidirectional inter-chip interconnect (ICI) bandwidth
# per chip over 4 ports, so at most half of it into a chip. An upper bound: a 2x4 slice may not
# use every port.
ICI_IN_BYTES_PER_SECOND = 400e9


def _attention_params(dim: int, heads: int) -> tuple[int, int]:
    """(matrix params, vector params) of one SelfAttention: qkv, q/k RMS norms, proj."""
    hd = dim // heads
    return dim * 3 * dim + dim * dim, 3 * dim + dim + 2 * hd


def _mlp_params(dim: int, ratio: int) -> tuple[int, int]:
    return 2 * dim * ratio * dim, ratio * dim + dim


def _split(*parts: tuple[int, int]) -> tuple[int, int]:
    return sum(p[0] for p in parts), sum(p[1] for p in parts)


def _lin(d_in: int, d_out: int) -> tuple[int, int]:
    """(matrix params, vector params) of model.attention.Linear: bf16 weight, f32 bias."""
    return d_in * d_out, d_out


def _dit_params(c: PipelineConfig) -> tuple[int, int]:
    d, p, r = c.dit.dim, c.dit.patch, c.dit.mlp_ratio
    cell = c.vae_scale * c.sr_scale
    block = _split(_attention_params(d, c.dit.heads), _mlp_params(d, r), _lin(d, 6 * d))
    outside = _split(
        _lin(c.latent_channels * p * p, d),
        _lin(c.latent_channels * p * p, d),
        _lin(3 * (cell * p) ** 2, d),
        _lin(c.n_mels, d),
        _lin(d, d),
        _lin(c.dit.freq_dim, d),
        _lin(d, d),
        _lin(d, 2 * d),
        _lin(d, c.latent_channels * p * p),
    )
    return block[0] * c.dit.depth + outside[0], block[1] * c.dit.depth + outside[1]


def _sr_params(c: PipelineConfig) -> tuple[int, int]:
    d, p, r = c.sr.dim, c.sr.patch, c.sr.mlp_ratio
    block = _split(_attention_params(d, c.sr.heads), _mlp_params(d, r), (0, 2 * d))  # + 2 RMS norms
    outside = _split(
        _lin(c.latent_channels * p * p, d),
        _lin(3 * (c.vae_scale * p) ** 2, d),
        (0, d),
        _lin(d, c.latent_channels * p * p),
    )
    return block[0] * c.sr.depth + outside[0], block[1] * c.sr.depth + outside[1]


def _vae_convs(c: PipelineConfig) -> list[tuple[int, int, int, bool]]:
    """Every 3x3 conv of the decoder as (c_in, c_out, output pixels / SR grid cells, upsamples)."""
    ch = c.vae.channels
    convs = [(c.latent_channels, ch[0], 1, False)]
    for i, ci in enumerate(ch):
        area = 4**i  # level i runs at 2^i x the SR grid per side
        convs += [(ci, ci, area, False), (ci, ci, area, False)]  # the level's ResBlock
        if i + 1 < len(ch):
            convs.append((ci, ch[i + 1], 4 ** (i + 1), True))  # Upsample: 2x nearest, then the conv
    convs.append((ch[-1], 3, 4 ** (len(ch) - 1), False))
    return convs


def _vae_params(c: PipelineConfig) -> tuple[int, int]:
    matrices = sum(9 * ci * co for ci, co, _, _ in _vae_convs(c))
    vectors = sum(co for _, co, _, _ in _vae_convs(c)) + sum(4 * ci for ci in c.vae.channels) + 2 * c.vae.channels[-1]
    return matrices, vectors


def param_counts(c: PipelineConfig) -> dict[str, int]:
    """Parameters per stage, exactly as the model modules create them."""
    return {name: sum(fn(c)) for name, fn in (("dit", _dit_params), ("sr", _sr_params), ("vae", _vae_params))}


def _weight_bytes(split: tuple[int, int]) -> int:
    return split[0] * _BF16 + split[1] * _F32  # bf16 matrices, f32 biases and norms (as stored)


@dataclass(frozen=True)
class StageFloor:
    stage: str
    passes: int  # how often the stage's weights are applied per chunk (the DiT: sampler steps)
    tokens: int  # sequence length of one pass (the VAE: output pixels of the chunk)
    flops: float  # whole mesh, per chunk
    attention_flops: float  # part of flops: scores and weighted sum over the live mask
    weight_bytes_per_chip: float  # per chunk: every weight read once per pass
    activation_bytes_per_chip: float  # per chunk: tensors that leave the chip, once each way
    compute_seconds: float  # flops / (chips x peak)
    memory_seconds: float  # bytes per chip / bandwidth
    gather_bytes_per_chip: float = 0.0  # per chunk: the other chips' weight shards, once per pass
    gather_seconds: float = 0.0  # gather_bytes_per_chip / ICI bandwidth into a chip

    @property
    def bytes_per_chip(self) -> float:
        return self.weight_bytes_per_chip + self.activation_bytes_per_chip

    @property
    def floor_seconds(self) -> float:
        return max(self.compute_seconds, self.memory_seconds)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_seconds >= self.memory_seconds else "memory"

    @property
    def floor_with_gathers_seconds(self) -> float:
        return max(self.floor_seconds, self.gather_seconds)

    def to_json(self) -> dict:
        return {
            **asdict(self),
            "bytes_per_chip": self.bytes_per_chip,
            "floor_seconds": self.floor_seconds,
            "bound": self.bound,
            "floor_with_gathers_seconds": self.floor_with_gathers_seconds,
        }


@dataclass(frozen=True)
class ShapeReport:
    config: str
    frames: int
    fps: int
    deadline_seconds: float
    params: dict[str, int]
    transformer_bf16_bytes: int  # DiT + SR parameters at 2 bytes each
    dit_tokens: int  # per pass (F x T_d)
    dit_steps: int
    sr_tokens: int  # (F + 1) x T: the reference frame included
    sr_window: int
    sr_live_fraction: float
    stages: list[StageFloor] = field(default_factory=list)

    @property
    def floor_seconds(self) -> float:
        return sum(s.floor_seconds for s in self.stages)

    @property
    def compute_floor_seconds(self) -> float:
        return sum(s.compute_seconds for s in self.stages)

    @property
    def floor_with_gathers_seconds(self) -> float:
        return sum(s.floor_with_gathers_seconds for s in self.stages)

    def to_json(self) -> dict:
        return {
            **{k: v for k, v in asdict(self).items() if k != "stages"},
            "stages": [s.to_json() for s in self.stages],
            "floor_seconds": self.floor_seconds,
            "floor_over_deadline": self.floor_seconds / self.deadline_seconds,
            "floor_with_gathers_seconds": self.floor_with_gathers_seconds,
        }


def _live_pairs(frames: int, window: int) -> int:
    """Live (query frame, key frame) pairs of the SR mask over frames 0..frames-1 (0 = reference):
    the kernels' own frame mask, counted."""
    from kernels.masks import frame_mask

    return int(frame_mask(frames, window).sum())


def _transformer_block_flops(tokens: int, dim: int, ratio: int) -> float:
    return 2.0 * tokens * dim * dim * (4 + 2 * ratio)  # qkv (3), proj (1), MLP (2 x ratio)


def _transformer_activation_bytes(tokens: int, dim: int, ratio: int, residual: int) -> float:
    """One block's minimum traffic: the residual stream in and out of each of its two sublayers,
    q/k/v and the attention output written and read once (bf16), the MLP hidden once (bf16)."""
    return tokens * dim * (4 * residual + 2 * (3 + 1) * _BF16 + 2 * ratio * _BF16)


def stage_floors(
    c: PipelineConfig,
    frames: int,
    peak_flops: float,
    bandwidth: float,
    chips: int = MESH_SIZE,
    ici_bandwidth: float = ICI_IN_BYTES_PER_SECOND,
) -> list[StageFloor]:
    """Flops, minimum bytes and time floors of each stage for one chunk of ``frames`` frames."""
    residual = _F32 if c.residual_dtype == "float32" else _BF16
    peak = chips * peak_flops

    def stage(name, passes, tokens, flops, attn, weights, acts) -> StageFloor:
        gathered = weights * (chips - 1) / chips
        return StageFloor(
            name,
            passes,
            tokens,
            flops,
            attn,
            weights,
            acts / chips,
            flops / peak,
            (weights + acts / chips) / bandwidth,
            gathered,
            gathered / ici_bandwidth,
        )

    # DiT: `steps` passes over F x T_d tokens, dense attention; conditioning once per chunk.
    d, r, steps = c.dit.dim, c.dit.mlp_ratio, c.dit.steps
    s = frames * c.dit_tokens_per_frame
    cp = c.latent_channels * c.dit.patch**2
    cell = c.vae_scale * c.sr_scale * c.dit.patch
    attn = 4.0 * s * s * d * c.dit.depth * steps
    per_step = (
        c.dit.depth * (_transformer_block_flops(s, d, r) + 2.0 * frames * d * 6 * d)
        + 2.0 * s * cp * d
        + 2.0 * s * d * cp
        + 2.0 * frames * d * 2 * d
        + 4.0 * d * d
    )
    once = 2.0 * c.dit_tokens_per_frame * d * (3 * cell * cell + cp) + 2.0 * frames * d * (c.n_mels + d)
    dit = stage(
        "dit",
        steps,
        s,
        steps * per_step + attn + once,
        attn,
        steps * _weight_bytes(_dit_params(c)),
        steps * c.dit.depth * _transformer_activation_bytes(s, d, r, residual),
    )

    # SR: one pass over (F + 1) x T tokens; attention over the frame-window mask's live blocks.
    d, r, t = c.sr.dim, c.sr.mlp_ratio, c.sr_tokens_per_frame
    s = (frames + 1) * t
    cp = c.latent_channels * c.sr.patch**2
    attn = 4.0 * _live_pairs(frames + 1, c.sr.window) * t * t * d * c.sr.depth
    flops = (
        c.sr.depth * _transformer_block_flops(s, d, r)
        + attn
        + 2.0 * frames * t * cp * d
        + 2.0 * t * 3 * (c.vae_scale * c.sr.patch) ** 2 * d
        + 2.0 * frames * t * d * cp
    )
    sr = stage(
        "sr",
        1,
        s,
        flops,
        attn,
        _weight_bytes(_sr_params(c)),
        c.sr.depth * _transformer_activation_bytes(s, d, r, residual),
    )

    # VAE: frames split over the chips; each conv reads its input and writes its output once (f32,
    # as the decoder keeps them); norms, activations and the nearest upsample fused into the convs.
    cells = c.sr_grid[0] * c.sr_grid[1]
    flops = acts = 0.0
    for ci, co, area, upsamples in _vae_convs(c):
        out_px = frames * cells * area
        in_px = out_px // 4 if upsamples else out_px  # the nearest upsample is fused: it reads 1/4
        flops += 2.0 * 9 * ci * co * out_px
        acts += _F32 * (ci * in_px + co * out_px)
    acts += frames * c.height * c.width * (3 + 3)  # the photo read and the uint8 frames written
    vae = stage(
        "vae", 1, frames * c.decoded_size[0] * c.decoded_size[1], flops, 0.0, _weight_bytes(_vae_params(c)), acts
    )
    return [dit, sr, vae]


def shape_report(
    c: PipelineConfig, frames: int, peak_flops: float, bandwidth: float, chips: int = MESH_SIZE
) -> ShapeReport:
    params = param_counts(c)
    return ShapeReport(
        config=c.name,
        frames=frames,
        fps=c.fps,
        deadline_seconds=frames / c.fps,
        params=params,
        transformer_bf16_bytes=_BF16 * (params["dit"] + params["sr"]),
        dit_tokens=c.dit_sequence(frames),
        dit_steps=c.dit.steps,
        sr_tokens=c.sr_sequence(frames),
        sr_window=c.sr.window,
        sr_live_fraction=_live_pairs(frames + 1, c.sr.window) / (frames + 1) ** 2,
        stages=stage_floors(c, frames, peak_flops, bandwidth, chips),
    )


def report_for_pipeline(pipeline: str, target: str = "tpu-v6e-8") -> list[ShapeReport]:
    """One report per shape bucket of a pipeline spec, at a target's published peaks."""
    from avatar_release.errors import SpecError
    from avatar_release.specs import load_pipeline, load_target
    from model.config import get_config

    spec, t = load_pipeline(pipeline), load_target(target)
    if not (t.peak_flops_per_second and t.hbm_bytes_per_second):
        raise SpecError(
            f"target {target} declares no peak_flops_per_second / hbm_bytes_per_second: "
            "floors need the device's published peaks (see manifests/targets/tpu-v6e-8.toml)"
        )
    c = get_config(spec.config)
    return [
        shape_report(c, b.frames, t.peak_flops_per_second, t.hbm_bytes_per_second, t.device_count) for b in spec.buckets
    ]


def _markdown(reports: list[ShapeReport]) -> str:
    rows = [
        "| config | stage | flops | HBM bytes/chip | compute floor | memory floor | bound | ICI gather floor |",
        "|---|---|---:|---:|---:|---:|---|---:|",
    ]
    for r in reports:
        name = f"{r.config}, {r.frames} frames"
        for s in r.stages:
            rows.append(
                f"| {name} | {s.stage} | {s.flops:.3g} | {s.bytes_per_chip / 1e9:.1f} GB | "
                f"{s.compute_seconds * 1e3:.1f} ms | {s.memory_seconds * 1e3:.1f} ms | {s.bound} | "
                f"{s.gather_seconds * 1e3:.1f} ms |"
            )
        d = r.deadline_seconds
        rows.append(
            f"| {name} | **sum** | | | | | **{r.floor_seconds * 1e3:.0f} ms = "
            f"{r.floor_seconds / d:.2f} of {d * 1e3:.0f} ms** | **{r.floor_with_gathers_seconds * 1e3:.0f} ms "
            f"= {r.floor_with_gathers_seconds / d:.2f}** |"
        )
    return "\n".join(rows)


if __name__ == "__main__":  # python -m model.shapes: the doc's table
    import sys

    names = sys.argv[1:] or ["avatar-720p", "avatar-1080p"]
    reps = [r for n in names for r in report_for_pipeline(n)]
    for r in reps:
        p = r.params
        print(
            f"{r.config}: params dit {p['dit'] / 1e9:.2f}B sr {p['sr'] / 1e9:.2f}B vae {p['vae'] / 1e6:.1f}M; "
            f"transformers {r.transformer_bf16_bytes / 1e9:.1f} GB bf16; DiT {r.dit_tokens} tokens x "
            f"{r.dit_steps} steps; SR {r.sr_tokens} tokens, window {r.sr_window}, live {r.sr_live_fraction:.3f}"
        )
    print(_markdown(reps))
