"""Configs of the puppet pipeline: plain dataclasses (``--set motion.hidden=...`` overrides a field).

No torch here: the release entry and config listing import this module alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["MotionConfig", "DecodeConfig", "PuppetConfig", "CONFIGS", "get_config"]


@dataclass(frozen=True)
class MotionConfig:
    pose_dim: int = 16  # the pose vector carried from frame to frame and chunk to chunk
    audio_features: int = 32  # per-frame audio features (a learned projection of the frame's samples)
    hidden: int = 64
    smoothing: float = 0.7  # pose_t = smoothing * pose_{t-1} + (1 - smoothing) * step
    noise_scale: float = 0.1


@dataclass(frozen=True)
class DecodeConfig:
    hidden: int = 64
    cell: int = 4  # the offset map is (height / cell, width / cell), upsampled by repetition
    contrast: float = 0.25  # how far the offsets move the photo's pixels (in [0, 1] units)


@dataclass(frozen=True)
class PuppetConfig:
    name: str = "tiny"
    height: int = 32
    width: int = 64
    fps: int = 25
    sample_rate: int = 16000
    samples_per_frame: int = 640
    id_cell: int = 8  # the photo is average-pooled by this for the identity code
    # Every matmul's contraction split into this many float32 partial sums, added in order:
    # the same math with reductions reordered (the pipeline's declared lever).
    matmul_k_split: int = 1
    motion: MotionConfig = field(default_factory=MotionConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def __post_init__(self) -> None:
        self.validate()

    @property
    def id_dim(self) -> int:
        return (self.height // self.id_cell) * (self.width // self.id_cell) * 3

    @property
    def offset_grid(self) -> tuple[int, int]:
        return self.height // self.decode.cell, self.width // self.decode.cell

    def validate(self) -> None:
        def need(ok: bool, what: str) -> None:
            if not ok:
                raise ValueError(what)

        need(
            self.height > 0 and self.width > 0 and self.height % 2 == 0 and self.width % 2 == 0,
            f"height and width must be positive and even (H.264), got {self.height}x{self.width}",
        )
        for cell, what in ((self.id_cell, "id_cell"), (self.decode.cell, "decode.cell")):
            need(
                cell > 0 and self.height % cell == 0 and self.width % cell == 0,
                f"{what} {cell} must divide height {self.height} and width {self.width}",
            )
        need(self.matmul_k_split >= 1, f"matmul_k_split must be >= 1, got {self.matmul_k_split}")
        need(0.0 <= self.motion.smoothing < 1.0, f"motion.smoothing must be in [0, 1), got {self.motion.smoothing}")
        need(
            self.samples_per_frame * self.fps == self.sample_rate,
            f"samples_per_frame * fps must equal sample_rate ({self.samples_per_frame} * {self.fps} != "
            f"{self.sample_rate})",
        )

    def chunk_samples(self, frames: int) -> int:
        return frames * self.samples_per_frame


CONFIGS = {
    "tiny": lambda: PuppetConfig(),
    "small": lambda: PuppetConfig(
        name="small",
        height=64,
        width=128,
        motion=MotionConfig(pose_dim=32, hidden=128),
        decode=DecodeConfig(hidden=128),
    ),
}


def get_config(name: str) -> PuppetConfig:
    if name not in CONFIGS:
        raise ValueError(f"unknown puppet config {name!r} (known: {', '.join(CONFIGS)})")
    return CONFIGS[name]()
