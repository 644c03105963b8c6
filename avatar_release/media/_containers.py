"""Which audio container a file is, from its first bytes: the demuxer ffmpeg is then told to use.

:class:`~.audio.AudioStream` names the demuxer (``-f``) instead of letting ffmpeg guess, so a
file is read only as one of the containers accepted here (``ACCEPTED_AUDIO``), never as a
playlist or a script; an image in an MP4-like box (HEIC, AVIF) is not taken for audio.
"""

from __future__ import annotations

from typing import BinaryIO

__all__ = ["sniff_container"]

# (container name for messages, ffmpeg demuxer)
_WAV, _AIFF, _FLAC, _OGG = ("WAV", "wav"), ("AIFF", "aiff"), ("FLAC", "flac"), ("Ogg", "ogg")
_MKV, _MP4, _MP3, _ADTS = ("WebM/Matroska", "matroska"), ("MP4/M4A", "mov"), ("MP3", "mp3"), ("AAC (ADTS)", "aac")
_IMAGE_BRANDS = (b"heic", b"heix", b"mif1", b"msf1", b"avif", b"avis")


def _sniff_plain(head: bytes) -> tuple[str, str] | None:
    if head[:4] in (b"RIFF", b"RF64", b"RIFX", b"BW64") and head[8:12] == b"WAVE":
        return _WAV
    if head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"):
        return _AIFF
    if head[:4] == b"fLaC":
        return _FLAC
    if head[:4] == b"OggS":
        return _OGG
    if head[:4] == b"\x1aE\xdf\xa3":
        return _MKV
    if head[4:8] == b"ftyp" and head[8:12] not in _IMAGE_BRANDS:
        return _MP4
    if len(head) >= 3 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0:  # MPEG audio frame sync
        layer, version, bitrate = (head[1] >> 1) & 3, (head[1] >> 3) & 3, head[2] >> 4
        if layer == 0 and head[1] & 0xF6 == 0xF0:
            return _ADTS
        if layer != 0 and version != 1 and bitrate != 15:
            return _MP3
    return None


def sniff_container(fh: BinaryIO) -> tuple[str, str] | None:
    """(container, ffmpeg demuxer) from a file's first bytes, or None if not one we accept."""
    head = fh.read(12)
    if head[:3] == b"ID3" and len(head) >= 10:  # an ID3v2 tag: look at what follows it
        size = (head[6] & 0x7F) << 21 | (head[7] & 0x7F) << 14 | (head[8] & 0x7F) << 7 | (head[9] & 0x7F)
        fh.seek(10 + size + (10 if head[5] & 0x10 else 0))
        after = _sniff_plain(fh.read(12))
        return after if after in (_FLAC, _ADTS) else _MP3
    return _sniff_plain(head)
