"""The media package's surface: one __all__ that names every public name of its rooms."""

from __future__ import annotations

import avatar_release.media as media
from avatar_release.media import audio, image, video


def test_all_names_every_public_name_of_the_rooms_and_each_resolves():
    rooms = set(image.__all__) | set(audio.__all__) | set(video.__all__)
    assert rooms <= set(media.__all__)
    assert all(hasattr(media, name) for name in media.__all__)
    assert len(media.__all__) == len(set(media.__all__))
