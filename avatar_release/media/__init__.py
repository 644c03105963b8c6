"""Media files in and out: reference pictures, speech tracks, and the rendered MP4.

Four modules, one job each:

* :mod:`.image`: JPEG, PNG and WebP in through Pillow (pixel bound checked from the header
  before decoding, EXIF orientation applied), fitted to the pipeline's resolution by a
  declared rule (``cover``, ``contain``, ``exact``); PNG frames out.
* :mod:`.audio`: WAV, MP3, M4A/AAC, FLAC, Ogg and WebM in through the ffmpeg binary that
  ``imageio-ffmpeg`` ships (never one from PATH), decoded incrementally to mono at the
  pipeline's rate by pinned options; 16-bit WAV out.
* :mod:`.video`: H.264/AAC MP4 out through the same binary, written while frames and samples
  arrive (``Mp4Writer``), probed and decoded for tests.
* :mod:`.samples`: deterministic sample inputs (a synthetic face picture, a speech-like track)
  drawn with numpy only, for gates, the CLI's defaults and tests.

Nothing is imported at import time beyond numpy: Pillow and imageio-ffmpeg load on first
use. Every file is written atomically through ``avatar_release._atomic``. Bad input raises
:class:`~avatar_release.errors.InputError` naming the file, what was found, what is accepted
and how to fix it with this tool; a failure of ffmpeg itself on valid input is a MediaError.
Frame comparisons (PSNR, digests) live with the gates that use them: ``avatar_release.gates.metrics``.

``python -m avatar_release.media`` converts a picture or a speech track the way a render
reads it, and writes the result as PNG or WAV.
"""

from ..errors import InputError, MediaError
from ._ffmpeg import ffmpeg_exe, ffmpeg_version
from ._h264 import BT709_ARGS
from .audio import (
    ACCEPTED_AUDIO,
    DEFAULT_MAX_AUDIO_SECONDS,
    RESAMPLER,
    AudioProbe,
    AudioSource,
    AudioStream,
    LoadedAudio,
    check_audio,
    encode_wav_bytes,
    load_audio,
    load_audio_bytes,
    pcm16,
    read_audio,
    stream_audio,
    write_wav,
)
from .image import (
    ACCEPTED_IMAGES,
    DEFAULT_FIT,
    DEFAULT_MAX_PIXELS,
    FIT_RESAMPLE,
    FIT_RULES,
    MAX_PIXELS_CEILING,
    ImageFit,
    LoadedImage,
    encode_png,
    fit_image,
    load_image,
    load_image_bytes,
    read_image,
    write_png,
)
from .samples import (
    NORM_WINDOW_S,
    PIECE_S,
    SampleFiles,
    sample_audio,
    sample_audio_pieces,
    sample_count,
    sample_image,
    write_samples,
)
from .video import Mp4File, Mp4Probe, Mp4Writer, probe_mp4, read_mp4_frames, write_mp4

__all__ = [
    # errors raised here
    "InputError",
    "MediaError",
    # images
    "ACCEPTED_IMAGES",
    "DEFAULT_FIT",
    "DEFAULT_MAX_PIXELS",
    "FIT_RESAMPLE",
    "FIT_RULES",
    "MAX_PIXELS_CEILING",
    "ImageFit",
    "LoadedImage",
    "encode_png",
    "fit_image",
    "load_image",
    "load_image_bytes",
    "read_image",
    "write_png",
    # audio
    "ACCEPTED_AUDIO",
    "DEFAULT_MAX_AUDIO_SECONDS",
    "RESAMPLER",
    "AudioProbe",
    "AudioSource",
    "AudioStream",
    "LoadedAudio",
    "check_audio",
    "encode_wav_bytes",
    "load_audio",
    "load_audio_bytes",
    "pcm16",
    "read_audio",
    "stream_audio",
    "write_wav",
    # video
    "BT709_ARGS",
    "Mp4File",
    "Mp4Probe",
    "Mp4Writer",
    "ffmpeg_exe",
    "ffmpeg_version",
    "probe_mp4",
    "read_mp4_frames",
    "write_mp4",
    # deterministic samples
    "NORM_WINDOW_S",
    "PIECE_S",
    "SampleFiles",
    "sample_audio",
    "sample_audio_pieces",
    "sample_count",
    "sample_image",
    "write_samples",
]
