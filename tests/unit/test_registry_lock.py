"""The one writer lock (registry._lock) and the one channel compare-and-swap (registry._cas), as
every store uses them: re-entrant within a thread, exclusive between threads and processes, and
never waiting forever."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from avatar_release.errors import ConflictError, RegistryError
from avatar_release.registry import LocalRegistry, OciRegistry
from avatar_release.registry.oci import RetryPolicy
from tests.oci_memory import MemoryDistribution

FAST = RetryPolicy(attempts=1, base_delay=0.001, max_delay=0.001)


def _publish(store, build_id: str) -> str:
    digest = store.put_blob(build_id.encode())
    doc = {
        "build_id": build_id,
        "weights": {"blob": {"digest": digest, "size": len(build_id), "media_type": "application/octet-stream"}},
    }
    return store.put_build(build_id, json.dumps(doc).encode())[0]


def _stores(tmp_path, timeout: float):
    server = MemoryDistribution()
    return {
        "local": LocalRegistry(tmp_path / "store", lock_timeout=timeout),
        "oci-memory": OciRegistry(
            "oci+http://registry.test/t/lock",
            session=server,
            retry=FAST,
            lock_dir=tmp_path / "locks",
            lock_timeout=timeout,
        ),
    }


@pytest.mark.parametrize("kind", ["local", "oci-memory"])
def test_a_writer_may_nest_writes_under_the_lock_it_holds(tmp_path, kind):
    store = _stores(tmp_path, 5.0)[kind]
    with store.exclusive():  # the local lock used to block forever here: flock is not re-entrant
        _publish(store, "b-1")
        entry = store.move_channel(
            "dev", store.resolve("b-1"), expected_digest=None, action="publish", who="t", reason="nested"
        )
    assert entry is not None and store.get_channel("dev").build_id == "b-1"


@pytest.mark.parametrize("kind", ["local", "oci-memory"])
def test_a_lock_held_elsewhere_times_out_with_who_to_wait_for(tmp_path, kind):
    store = _stores(tmp_path, 0.3)[kind]
    _publish(store, "b-1")
    held, release = threading.Event(), threading.Event()

    def holder():
        with store.exclusive():
            held.set()
            release.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    try:
        assert held.wait(60)  # only a hang guard: the holder takes the lock at once
        # The holder keeps the lock until released below: a writer that waited instead of giving up
        # would get it then and publish, and pytest.raises would fail.
        with pytest.raises(RegistryError, match=r"another writer has held the lock .* for over 0s.*wait for it"):
            store.move_channel(
                "dev", store.resolve("b-1"), expected_digest=None, action="publish", who="t", reason="blocked"
            )
    finally:
        release.set()
        t.join()
    assert store.get_channel("dev") is None  # nothing was written by the writer that gave up


def test_the_lock_excludes_another_process(tmp_path):
    store = LocalRegistry(tmp_path / "store", lock_timeout=0.3)
    script = (
        "import sys, time; from avatar_release.registry import LocalRegistry\n"
        "with LocalRegistry(sys.argv[1]).exclusive():\n    print('held', flush=True); time.sleep(3)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script, str(store.root)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(RegistryError, match="another writer has held the lock"):
            with store.exclusive():
                pass
    finally:
        proc.kill()
        proc.wait()
    with store.exclusive():  # released when the holder died
        pass


@pytest.mark.parametrize("kind", ["local", "oci-memory"])
def test_every_store_refuses_a_stale_move_with_the_same_words(tmp_path, kind):
    store = _stores(tmp_path, 5.0)[kind]
    d1, d2 = _publish(store, "b-1"), _publish(store, "b-2")
    store.move_channel("prod", store.resolve("b-1"), expected_digest=None, action="promote", who="t", reason="r")
    with pytest.raises(ConflictError) as refused:
        store.move_channel("prod", store.resolve("b-2"), expected_digest=None, action="promote", who="t", reason="r")
    assert str(refused.value) == (
        f"channel 'prod' moved while this promote was being decided: expected it at empty, "
        f"found {d1} (b-1); nothing was changed — retry"
    )
    assert store.get_channel("prod").digest == d1 and d2 != d1
