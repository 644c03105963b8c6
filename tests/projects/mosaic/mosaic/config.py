"""The mosaic config: a plain dataclass (``--set pose=...`` overrides a field). No torch here."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MosaicConfig:
    height: int = 16
    width: int = 32
    fps: int = 25
    sample_rate: int = 16000
    samples_per_frame: int = 640
    cell: int = 4  # the photo is average-pooled by this, for the identity code and the offset grid
    identity: int = 16  # the identity code encode makes of the photo
    pose: int = 8  # the pose carried from frame to frame and chunk to chunk
    smoothing: float = 0.6
    contrast: float = 0.25

    @property
    def cells(self) -> int:
        return (self.height // self.cell) * (self.width // self.cell) * 3


CONFIGS = {"tiny": MosaicConfig}
