"""Pipeline configs: the shapes of the three stages, with the constraints that tie them together.

Torch-free on purpose: the compile step, the manifests and the runtime loader read these shapes
without importing torch.

Geometry of one chunk of F frames (names used in every shape comment of the model code):

    pixels   (H, W)            height x width of the delivered video
    SR grid  (H', W')          SR latent cells; one cell decodes to vae_scale x vae_scale pixels.
                               H' = ceil(H / vae_scale) rounded up so every patch fits; the VAE
                               output (H' * vae_scale rows) is cropped back to H (1088 -> 1080).
    DiT grid (h, w)            DiT latent cells = SR grid / sr_scale
    tokens                     a patch x patch square of cells is one token:
                               DiT T_d = (h/p_d)(w/p_d) per frame, SR T = (H'/p_s)(W'/p_s) per frame
    sequences                  DiT F * T_d tokens; SR (F + 1) * T tokens (+1: the reference frame)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from model.errors import ConfigError

# The pipeline's stages, in the order a chunk runs them (model/release.py declares them to the toolchain).
STAGES = ("dit", "sr", "vae")
MESH_SIZE = 8  # devices in the serving mesh: Ulysses shards the sequence, then the heads, over it
RESIDUAL_DTYPES = ("float32", "bfloat16")
ATTENTION_KERNELS = ("xla", "blocksparse", "bounded")
DIT_ATTENTION_KERNELS = ("xla", "flash")
VAE_WEIGHT_LAYOUTS = ("sharded", "replicated")


@dataclass(frozen=True)
class DiTConfig:
    dim: int  # width of the residual stream
    depth: int  # transformer blocks
    heads: int  # attention heads; a multiple of MESH_SIZE so Ulysses can hand each device whole heads
    steps: int  # Euler steps of the rectified-flow sampler, unrolled into one program per chunk
    patch: int = 1  # DiT latent cells per token side
    mlp_ratio: int = 4  # hidden width of the MLP / dim
    freq_dim: int = 256  # sinusoidal timestep features fed to the timestep MLP
    # Kernel the compiler routes the DiT's (unmasked) attention to: "xla" (XLA's softmax
    # attention, which materialises the S x S logits of every head) or "flash" (kernels/flash.py:
    # online softmax over key blocks, the logits only ever in VMEM). Eager PyTorch always runs
    # the reference math; a declared lever (manifests/levers.toml, key "dit.attention").
    attention: str = "xla"


@dataclass(frozen=True)
class SRConfig:
    dim: int
    depth: int
    heads: int  # a multiple of MESH_SIZE, as for the DiT
    window: int = 1  # a frame attends to frames within +-window of itself (plus the reference frame)
    patch: int = 1  # SR latent cells per token side
    mlp_ratio: int = 4
    # Ulysses head groups of the SR's attention; 0: the pipeline's ulysses_groups. Its own
    # setting because the two transformers' head counts differ (production: 24 SR heads split
    # into 3 groups of one head per device, which the DiT's 40 cannot).
    ulysses_groups: int = 0


@dataclass(frozen=True)
class VAEConfig:
    # Channels per resolution level, coarsest first: one level per 2x upsample, so there are
    # log2(vae_scale) + 1 entries.
    channels: tuple[int, ...] = (32, 32, 16)
    groups: int = 8  # GroupNorm groups; must divide every channel count
    # The decoder moves each reference-image pixel by at most this many levels (64 * tanh(.)):
    # random weights then still give a video that looks like the photo.
    skip_scale: float = 64.0
    # How a build lays the decoder's weights on the mesh: "sharded" (FSDP like the transformers:
    # each convolution splits over output channels, and the activations are gathered between
    # layers) or "replicated" (each device holds all 15M parameters at production size and
    # decodes its own frames). A lever: XLA:CPU sums a replicated convolution in another order,
    # so tiny's frames move by 1 level in about 0.5% of values.
    weights: str = "sharded"
    # How each GroupNorm reduces: "grouped" (F.group_norm) or "per_channel" (per-channel means,
    # then the group's mean of them: the full-size activation is never reshaped to its groups,
    # which on TPU was a layout copy per norm). A lever: the same statistics summed in another order.
    norm_stats: str = "grouped"


@dataclass(frozen=True)
class PipelineConfig:
    name: str
    frames_per_chunk: int  # frames rendered per chunk: the unit of streaming and of compilation
    height: int  # delivered pixels
    width: int
    latent_channels: int  # C, shared by the DiT and SR latents
    vae_scale: int  # pixels per SR latent cell side; a power of two (one 2x upsample per VAE level)
    sr_scale: int  # SR latent cells per DiT latent cell side
    n_mels: int  # mel bands of the per-frame audio features
    dit: DiTConfig
    sr: SRConfig
    vae: VAEConfig = field(default_factory=VAEConfig)
    fps: int = 25
    sample_rate: int = 16000  # audio samples per second; fps must divide it (whole samples per frame)
    # dtype of the residual stream between blocks. Matmuls run in bf16 either way. "bfloat16" is
    # the faster lever the similarity-band gate rejects on the production model; keep "float32".
    residual_dtype: str = "float32"
    # Split the contraction of every bf16 matmul into this many parts, as a K-tiled kernel does:
    # bf16 operands, float32 partial products summed in float32, rounded to bf16 like one dot.
    # Mathematically the same product; only the reduction order (and so the rounding) changes.
    # 1 = one dot per matmul. The similarity band is calibrated with this lever (gate calibrate).
    matmul_k_split: int = 1
    # Attention kernel the compiler routes the model's attention call to (through torchax):
    # "xla" (XLA's own fused softmax attention), "blocksparse" (frame-aligned block-sparse Pallas
    # kernel for the masked SR attention), "bounded" (block-sparse with the bounded softmax).
    # Eager PyTorch always runs the reference math.
    attention_kernel: str = "xla"
    # Ulysses head groups: independent all-to-all -> attention -> all-to-all groups per layer.
    # 1 = one group. Grouping leaves per-head math unchanged (bit-exact).
    ulysses_groups: int = 1
    # Call each attention's pre-attention chain (qkv projection, q/k RMS norm, rotary) as one op
    # that a build routes to the fused Pallas kernel (kernels/preattn.py). Eager: the same math.
    fused_preattn: bool = False
    # Run each transformer's blocks as one scanned block over stacked weights when compiled
    # (model/stack.py): compile time independent of depth. Eager PyTorch loops either way.
    scan_layers: bool = False

    def __post_init__(self) -> None:
        self.validate()

    # ---- derived geometry -------------------------------------------------------------------

    @property
    def samples_per_frame(self) -> int:
        return self.sample_rate // self.fps

    def chunk_samples(self, frames: int | None = None) -> int:
        """Audio samples that drive `frames` frames (default: one whole chunk)."""
        return (self.frames_per_chunk if frames is None else frames) * self.samples_per_frame

    @property
    def _grid_multiple(self) -> int:
        # An SR grid side must split into whole SR patches and into whole DiT patches after the
        # sr_scale downsample.
        return math.lcm(self.sr.patch, self.sr_scale * self.dit.patch)

    @property
    def sr_grid(self) -> tuple[int, int]:
        """(H', W'): SR latent cells, rounded up so the grid tiles into patches."""
        m = self._grid_multiple
        return tuple(_round_up(-(-side // self.vae_scale), m) for side in (self.height, self.width))

    @property
    def decoded_size(self) -> tuple[int, int]:
        """Pixels the VAE produces before the crop to (height, width)."""
        hs, ws = self.sr_grid
        return hs * self.vae_scale, ws * self.vae_scale

    @property
    def dit_grid(self) -> tuple[int, int]:
        """(h, w): DiT latent cells."""
        hs, ws = self.sr_grid
        return hs // self.sr_scale, ws // self.sr_scale

    @property
    def dit_tokens_per_frame(self) -> int:
        h, w = self.dit_grid
        return (h // self.dit.patch) * (w // self.dit.patch)

    @property
    def sr_tokens_per_frame(self) -> int:
        hs, ws = self.sr_grid
        return (hs // self.sr.patch) * (ws // self.sr.patch)

    def dit_sequence(self, frames: int | None = None) -> int:
        return (self.frames_per_chunk if frames is None else frames) * self.dit_tokens_per_frame

    def sr_sequence(self, frames: int | None = None) -> int:
        return ((self.frames_per_chunk if frames is None else frames) + 1) * self.sr_tokens_per_frame

    # ---- constraints --------------------------------------------------------------------------

    def validate(self) -> PipelineConfig:
        """Raise ConfigError listing every violated constraint; return self when there is none."""
        problems: list[str] = []

        def need(ok: bool, message: str) -> None:
            if not ok:
                problems.append(message)

        for name in (
            "frames_per_chunk",
            "height",
            "width",
            "latent_channels",
            "vae_scale",
            "sr_scale",
            "n_mels",
            "fps",
            "sample_rate",
        ):
            need(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        need(
            self.residual_dtype in RESIDUAL_DTYPES,
            f"residual_dtype must be one of {RESIDUAL_DTYPES}, got {self.residual_dtype!r}",
        )
        need(self.matmul_k_split >= 1, f"matmul_k_split must be >= 1, got {self.matmul_k_split}")
        need(
            self.attention_kernel in ATTENTION_KERNELS,
            f"attention_kernel must be one of {ATTENTION_KERNELS}, got {self.attention_kernel!r}",
        )
        need(self.ulysses_groups >= 1, f"ulysses_groups must be >= 1, got {self.ulysses_groups}")
        need(
            self.sr.ulysses_groups >= 0,
            f"sr.ulysses_groups must be >= 0 (0: ulysses_groups), got {self.sr.ulysses_groups}",
        )
        need(
            self.dit.attention in DIT_ATTENTION_KERNELS,
            f"dit.attention must be one of {DIT_ATTENTION_KERNELS}, got {self.dit.attention!r}",
        )
        if problems:  # the arithmetic below needs positive sizes
            raise ConfigError(f"config {self.name!r}: " + "; ".join(problems))

        need(
            self.sample_rate % self.fps == 0,
            f"fps ({self.fps}) must divide sample_rate ({self.sample_rate}): whole samples per frame",
        )
        need(
            self.n_mels <= self.samples_per_frame // 2 + 1,
            f"n_mels ({self.n_mels}) exceeds the {self.samples_per_frame // 2 + 1} DFT bins of one frame",
        )
        levels = self.vae_scale.bit_length() - 1
        need(self.vae_scale == 1 << levels, f"vae_scale must be a power of two, got {self.vae_scale}")
        need(
            len(self.vae.channels) == levels + 1,
            f"vae.channels needs log2(vae_scale) + 1 = {levels + 1} entries, got {len(self.vae.channels)}",
        )
        need(
            self.vae.norm_stats in ("grouped", "per_channel"),
            f"vae.norm_stats must be grouped or per_channel, got {self.vae.norm_stats!r}",
        )
        need(
            self.vae.weights in VAE_WEIGHT_LAYOUTS,
            f"vae.weights must be one of {VAE_WEIGHT_LAYOUTS}, got {self.vae.weights!r}",
        )
        need(
            all(c % self.vae.groups == 0 for c in self.vae.channels),
            f"vae.groups ({self.vae.groups}) must divide every vae.channels entry {self.vae.channels}",
        )

        for stage in ("dit", "sr"):
            s = getattr(self, stage)
            for name in ("dim", "depth", "heads", "patch", "mlp_ratio"):
                need(getattr(s, name) >= 1, f"{stage}.{name} must be >= 1, got {getattr(s, name)}")
            need(
                s.heads % MESH_SIZE == 0,
                f"{stage}.heads ({s.heads}) must be a multiple of {MESH_SIZE}: Ulysses gives each "
                f"device of the {MESH_SIZE}-device mesh whole heads",
            )
            need(s.dim % max(s.heads, 1) == 0, f"{stage}.heads ({s.heads}) must divide {stage}.dim ({s.dim})")
            groups, which = self.ulysses_groups, "ulysses_groups"
            if stage == "sr" and self.sr.ulysses_groups:
                groups, which = self.sr.ulysses_groups, "sr.ulysses_groups"
            need(
                s.heads % (MESH_SIZE * max(groups, 1)) == 0,
                f"{stage}.heads ({s.heads}) must split into {which} ({groups}) groups of "
                f"whole heads per device ({MESH_SIZE} devices)",
            )
            head_dim = s.dim // max(s.heads, 1)
            need(
                head_dim % 2 == 0 and head_dim >= 6,
                f"{stage} head_dim ({head_dim}) must be even and >= 6: rotary covers (frame, row, col)",
            )
        need(self.dit.steps >= 1, f"dit.steps must be >= 1, got {self.dit.steps}")
        need(self.sr.window >= 0, f"sr.window must be >= 0, got {self.sr.window}")

        # Ulysses splits each sequence into MESH_SIZE equal shards.
        need(
            self.dit_sequence() % MESH_SIZE == 0,
            f"DiT sequence {self.frames_per_chunk} frames x {self.dit_tokens_per_frame} tokens = "
            f"{self.dit_sequence()} must be a multiple of {MESH_SIZE}",
        )
        need(
            self.sr_sequence() % MESH_SIZE == 0,
            f"SR sequence ({self.frames_per_chunk} + 1) frames x {self.sr_tokens_per_frame} tokens = "
            f"{self.sr_sequence()} must be a multiple of {MESH_SIZE}",
        )
        # The SR mask is frame-aligned. Attention blocks that are multiples of 16 (the finest bf16
        # tiling along the sequence) can divide a frame's token span exactly, so every block is
        # wholly inside or outside the mask.
        t = self.sr_tokens_per_frame
        need(t % 16 == 0, f"SR tokens per frame ({t}) must be a multiple of 16")
        # Deliberately NOT a multiple of 128, as in production: stock 128-token tiles then straddle
        # frame boundaries (partial blocks, mask predicates, padding). That misalignment is what the
        # frame-aligned kernel work removes, so the small configs must exhibit it too.
        need(t % 128 != 0, f"SR tokens per frame ({t}) must not be a multiple of 128 (see comment)")

        if problems:
            raise ConfigError(f"config {self.name!r}: " + "; ".join(problems))
        return self

    # ---- (de)serialisation and overrides ------------------------------------------------------

    def replace(self, **overrides: Any) -> PipelineConfig:
        """A validated copy with fields replaced; nested fields as "sr.window" (pass via **{...})."""
        top: dict[str, Any] = {}
        nested: dict[str, dict[str, Any]] = {}
        for key, value in overrides.items():
            head, dot, rest = key.partition(".")
            if dot:
                nested.setdefault(head, {})[rest] = value
            else:
                top[key] = value
        try:
            for head, sub in nested.items():
                if head not in ("dit", "sr", "vae"):
                    raise ConfigError(f"config {self.name!r}: no nested config {head!r} (dit, sr, vae)")
                top[head] = dataclasses.replace(top.get(head, getattr(self, head)), **sub)
            return dataclasses.replace(self, **top)
        except TypeError as e:  # an unknown field name
            raise ConfigError(f"config {self.name!r}: bad override {sorted(overrides)}: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PipelineConfig:
        d = dict(d)
        vae = dict(d.pop("vae", {}))
        if "channels" in vae:
            vae["channels"] = tuple(vae["channels"])
        return cls(dit=DiTConfig(**d.pop("dit")), sr=SRConfig(**d.pop("sr")), vae=VAEConfig(**vae), **d)


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


_CONFIGS = {
    c.name: c
    for c in [
        # CI: one 8-frame chunk renders in seconds on 2 CPU cores through XLA.
        # SR grid 12x20 = 240 tokens/frame (240 % 128 = 112: misaligned), DiT grid 6x10 = 60.
        PipelineConfig(
            name="tiny",
            frames_per_chunk=8,
            height=48,
            width=80,
            latent_channels=8,
            vae_scale=4,
            sr_scale=2,
            n_mels=32,
            dit=DiTConfig(dim=64, depth=2, heads=8, steps=4),
            sr=SRConfig(dim=64, depth=2, heads=8, window=1),
            vae=VAEConfig(channels=(32, 32, 16), groups=8),
        ),
        # Benchmarks on a laptop: SR grid 24x40 = 960 tokens/frame (960 % 128 = 64), DiT 12x20 = 240.
        PipelineConfig(
            name="small",
            frames_per_chunk=8,
            height=96,
            width=160,
            latent_channels=16,
            vae_scale=4,
            sr_scale=2,
            n_mels=64,
            dit=DiTConfig(dim=128, depth=4, heads=8, steps=8),
            sr=SRConfig(dim=128, depth=4, heads=8, window=1),
            vae=VAEConfig(channels=(64, 64, 32), groups=16),
        ),
        # Production shapes, used only as abstract shapes (18.5B parameters, 37.0 GB of bf16:
        # 17.1B DiT + 1.4B SR), derived from the write-up's constraints and the v6e-8's published
        # peaks in docs/concepts/production-shapes.md (model/shapes.py computes the floors): the
        # DiT samples in 4 steps, each re-reading every weight on every chip; the SR, run once
        # over 4x the DiT's tokens, is the shallow one.
        # SR grid 92x160 (736 rows cropped to 720), patch 2 -> 46x80 = 3680 tokens/frame
        # (3680 % 128 = 96); 17 frames -> 62560 SR tokens. DiT 46x80 cells, patch 2 -> 920/frame.
        PipelineConfig(
            name="avatar-720p",
            frames_per_chunk=16,
            scan_layers=True,
            attention_kernel="blocksparse",
            height=720,
            width=1280,
            latent_channels=16,
            vae_scale=8,
            sr_scale=2,
            n_mels=80,
            dit=DiTConfig(dim=5120, depth=36, heads=40, steps=4, patch=2, attention="flash"),
            sr=SRConfig(dim=3072, depth=12, heads=24, window=2, patch=2, ulysses_groups=3),
            vae=VAEConfig(channels=(512, 512, 256, 128), groups=32, weights="replicated", norm_stats="per_channel"),
        ),
        # SR grid 136x240 (1088 rows cropped to 1080), patch 2 -> 68x120 = 8160 tokens/frame
        # (8160 % 128 = 96); 9 frames (the 8-frame bucket) -> 73440 SR tokens. The SR upsamples
        # 4x, so the DiT renders motion on a 34x60 cell grid, patch 2 -> 17x30 = 510 tokens/frame:
        # at 2x (2040 tokens/frame) its compute floor alone was 1.7x the 320 ms deadline.
        PipelineConfig(
            name="avatar-1080p",
            frames_per_chunk=16,
            scan_layers=True,
            attention_kernel="blocksparse",
            height=1080,
            width=1920,
            latent_channels=16,
            vae_scale=8,
            sr_scale=4,
            n_mels=80,
            dit=DiTConfig(dim=5120, depth=36, heads=40, steps=4, patch=2, attention="flash"),
            sr=SRConfig(dim=3072, depth=12, heads=24, window=2, patch=2, ulysses_groups=3),
            vae=VAEConfig(channels=(512, 512, 256, 128), groups=32, weights="replicated", norm_stats="per_channel"),
        ),
    ]
}
CONFIG_NAMES: tuple[str, ...] = tuple(_CONFIGS)


def get_config(name: str) -> PipelineConfig:
    try:
        return _CONFIGS[name]
    except KeyError:
        raise ConfigError(f"unknown pipeline config {name!r}; known: {', '.join(CONFIG_NAMES)}") from None
