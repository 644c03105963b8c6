"""A pod's swap to a new build takes what that build shares with the one it serves, byte for byte
(runtime/_reuse.py): the placed weights and the programs, never fetched, deserialized or placed
again, and the swapped build renders exactly what a fresh load of it renders, with zero compiles."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from avatar_release.media import sample_audio, sample_image


def _frames(build) -> np.ndarray:
    from avatar_release.runtime import stream

    p = build.manifest.program
    image = sample_image(p.height, p.width)
    return np.concatenate([c.frames for c in stream(build, image, sample_audio(0.5, sample_rate=p.sample_rate))])


def _arrays(build) -> dict[int, object]:
    return {id(v): v for ls in build.stages.values() for v in ls.params.values()}


def _tensors(manifest) -> dict[str, int]:
    return {t.name: t.nbytes for c in manifest.weights.chunks for t in c.tensors}


def test_a_swap_takes_the_weights_it_shares_and_renders_what_a_fresh_load_renders(registry_copy, build_cache):
    from avatar_release.promote import publish_to_dev
    from avatar_release.registry import LocalRegistry, read_manifest
    from avatar_release.runtime import load
    from avatar_release.serving import start_pod

    root, a = registry_copy
    reg = LocalRegistry(root)
    # another program over the same weights (the same chunks, by digest)
    b = build_cache.compile("tiny", "cpu-8", registry=reg, overrides={"matmul_k_split": "2"}, move_dev=False)
    pod = start_pod(reg, "dev")
    old = pod.build
    publish_to_dev(reg, read_manifest(reg, b.digest)[0], reason="test: swap")
    assert pod.check_channel() == "swapped"
    new = pod.build
    assert new.build_id == b.build_id and new.guard.count == 0
    tensors = _tensors(new.manifest)
    same_programs = {e.raw_digest for e in old.manifest.executables}
    programs = sum(e.raw_digest in same_programs for e in new.manifest.executables)  # (none: k-split changes them)
    assert new.timings.shared == {"programs": programs, "tensors": len(tensors), "raw_bytes": sum(tensors.values())}
    assert new.timings.weight_path is None  # no chunk was fetched
    assert set(_arrays(new)) <= set(_arrays(old))  # the very arrays the old build placed: no second copy
    assert pod.health()["load"]["shared"]["tensors"] == len(tensors)

    fresh = load(b.digest, reg)  # the same build loaded on its own: every chunk fetched and placed
    assert fresh.timings.shared is None and fresh.timings.weight_path["chunks"] == len(fresh.manifest.weights.chunks)
    assert not set(_arrays(fresh)) & set(_arrays(old))
    np.testing.assert_array_equal(_frames(new), _frames(fresh))
    assert new.guard.count == 0 and fresh.guard.count == 0


def test_reloading_the_served_build_takes_its_programs_and_checks_their_fingerprints(registry_copy):
    from avatar_release.registry import LocalRegistry
    from avatar_release.runtime import load

    root, a = registry_copy
    reg = LocalRegistry(root)
    served = load(a.digest, reg)
    again = load(a.digest, reg, serving=served)
    n = len(served.manifest.executables)
    assert again.timings.shared["programs"] == n and again.timings.deserialize == 0
    assert all(again.stages[k].executable is served.stages[k].executable for k in served.stages)
    np.testing.assert_array_equal(_frames(again), _frames(served))
    assert again.guard.count == 0


def test_a_tensor_whose_chunk_digest_differs_is_loaded_not_taken(registry_copy):
    """Sameness is the digest the new manifest names, not the tensor's name: a chunk with other raw
    bytes (here, a manifest naming another digest for chunk 0) shares none of its tensors."""
    from avatar_release.registry import LocalRegistry
    from avatar_release.runtime import load
    from avatar_release.runtime._reuse import shared_with

    root, a = registry_copy
    served = load(a.digest, LocalRegistry(root))
    m = served.manifest
    first, *rest = m.weights.chunks
    other = first.model_copy(update={"raw_digest": "sha256:" + "0" * 64})
    changed = m.model_copy(update={"weights": m.weights.model_copy(update={"chunks": [other, *rest]})})
    taken = {name for name, _ in shared_with(served, changed, served.mesh).arrays}
    assert taken == {t.name for c in rest for t in c.tensors} and not taken & {t.name for t in first.tensors}
    assert {name for name, _ in shared_with(served, m, served.mesh).arrays} == set(_tensors(m))
    assert shared_with(None, m, served.mesh).arrays == {}


def test_a_pod_runs_its_callers_work_beside_the_load_and_names_the_works_failure(registry_copy):
    """``start_pod(beside=...)`` (``serve``: the HTTP server's imports while the build loads): the work
    runs on a thread of its own and the pod is ready as without it; work that fails fails the start."""
    from avatar_release.registry import LocalRegistry
    from avatar_release.serving import start_pod

    reg = LocalRegistry(registry_copy[0])
    ran_on = []
    pod = start_pod(reg, "dev", beside=lambda: ran_on.append(threading.current_thread().name))
    assert len(ran_on) == 1 and ran_on[0] != threading.current_thread().name
    assert pod.ready and pod.build.guard.count == 0

    def broken() -> None:
        raise ImportError("No module named 'uvicorn'")

    with pytest.raises(ImportError, match="uvicorn"):
        start_pod(reg, "dev", beside=broken)
