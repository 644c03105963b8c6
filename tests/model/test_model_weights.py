"""Seeded init, safetensors round trip, and every way a weights file can be wrong."""

import re
from pathlib import Path

import pytest

from tests.tools import module

torch = module("torch")  # the [compile] extra
module("safetensors")

from safetensors.torch import load_file, save_file  # noqa: E402

import model.weights as weights_module  # noqa: E402
from model.errors import WeightsError  # noqa: E402
from model.weights import init_pipeline, load_weights, save_weights  # noqa: E402


def _same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) and sa[k].dtype == sb[k].dtype for k in sa)


def test_init_is_deterministic_and_seed_dependent(tiny, tiny_pipeline):
    assert _same_state(init_pipeline(tiny, 1234), tiny_pipeline)
    assert not _same_state(init_pipeline(tiny, 1235), tiny_pipeline)


def test_init_leaves_global_rng_alone(tiny):
    before = torch.random.get_rng_state()
    init_pipeline(tiny, 3)
    assert torch.equal(torch.random.get_rng_state(), before)


def test_state_dict_is_exactly_the_parameters_with_bf16_matmul_weights(tiny_pipeline):
    state = tiny_pipeline.state_dict()
    assert set(state) == {name for name, _ in tiny_pipeline.named_parameters()}  # no buffers
    assert state["dit.blocks.0.attn.qkv.weight"].dtype == torch.bfloat16
    assert state["vae.conv_in.weight"].dtype == torch.bfloat16
    assert state["dit.blocks.0.attn.qkv.bias"].dtype == torch.float32
    assert state["sr.blocks.0.norm1.weight"].dtype == torch.float32


def test_round_trip(tiny, tiny_pipeline, tmp_path):
    path = save_weights(tiny_pipeline, tmp_path / "w.safetensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.safetensors"]  # no temp file left
    loaded = load_weights(tiny, path)
    assert _same_state(loaded, tiny_pipeline)
    assert not any(p.requires_grad or p.is_meta for p in loaded.parameters())


def test_failed_save_leaves_nothing(tiny_pipeline, tmp_path, monkeypatch):
    def half_write(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(weights_module, "save_file", half_write)
    with pytest.raises(OSError, match="disk full"):
        save_weights(tiny_pipeline, tmp_path / "w.safetensors")
    assert list(tmp_path.iterdir()) == []


def test_failed_save_keeps_the_previous_file(tiny, tiny_pipeline, tmp_path, monkeypatch):
    path = save_weights(tiny_pipeline, tmp_path / "w.safetensors")
    monkeypatch.setattr(weights_module, "save_file", lambda *a, **k: (_ for _ in ()).throw(OSError("boom")))
    with pytest.raises(OSError):
        save_weights(init_pipeline(tiny, 9), path)
    assert _same_state(load_weights(tiny, path), tiny_pipeline)


def test_missing_file(tiny, tmp_path):
    path = tmp_path / "nope.safetensors"
    with pytest.raises(WeightsError, match=rf"^weights file {re.escape(str(path))}: not found$"):
        load_weights(tiny, path)


def test_garbage_file(tiny, tmp_path):
    path = tmp_path / "w.safetensors"
    path.write_bytes(b"\x00not a safetensors file at all")
    with pytest.raises(WeightsError, match=rf"^weights file {re.escape(str(path))}: not a readable safetensors file"):
        load_weights(tiny, path)


@pytest.fixture
def tensors(tiny_pipeline):
    return {k: v.contiguous() for k, v in tiny_pipeline.state_dict().items()}


def _load_edited(tiny, tmp_path, tensors):
    path = tmp_path / "w.safetensors"
    save_file(tensors, str(path))
    with pytest.raises(WeightsError) as info:
        load_weights(tiny, path)
    message = str(info.value)
    assert message.startswith(f"weights file {path}: ")
    return message


def test_missing_tensors_are_listed(tiny, tmp_path, tensors):
    del tensors["sr.out.weight"], tensors["dit.blocks.1.mlp.fc2.bias"]
    message = _load_edited(tiny, tmp_path, tensors)
    assert "missing 2 tensor(s) for config 'tiny': 'dit.blocks.1.mlp.fc2.bias', 'sr.out.weight'" in message


def test_unexpected_tensors_are_listed(tiny, tmp_path, tensors):
    tensors["dit.blocks.2.attn.qkv.weight"] = torch.zeros(192, 64, dtype=torch.bfloat16)
    message = _load_edited(tiny, tmp_path, tensors)
    assert "1 unexpected tensor(s) for config 'tiny': 'dit.blocks.2.attn.qkv.weight'" in message


def test_wrong_shape_names_tensor_expected_and_actual(tiny, tmp_path, tensors):
    tensors["dit.blocks.0.attn.qkv.weight"] = tensors["dit.blocks.0.attn.qkv.weight"].T.contiguous()
    message = _load_edited(tiny, tmp_path, tensors)
    assert message.endswith("tensor 'dit.blocks.0.attn.qkv.weight' has shape (64, 192), expected (192, 64)")


def test_wrong_dtype_names_tensor_expected_and_actual(tiny, tmp_path, tensors):
    tensors["vae.conv_out.weight"] = tensors["vae.conv_out.weight"].float()
    message = _load_edited(tiny, tmp_path, tensors)
    assert message.endswith("tensor 'vae.conv_out.weight' has dtype float32, expected bfloat16")


def test_weights_of_another_config_are_refused(tmp_path, tiny_pipeline):
    from model.config import get_config

    path = save_weights(tiny_pipeline, tmp_path / "w.safetensors")
    with pytest.raises(
        WeightsError, match=r"missing 48 tensor\(s\) for config 'small'.*has shape .*more tensors of the wrong shape"
    ):
        load_weights(get_config("small"), path)
    assert load_file(path)  # the file itself is intact


@pytest.mark.slow  # a fresh process importing torch
def test_init_is_identical_in_a_fresh_process(tiny_pipeline):
    import hashlib
    import subprocess
    import sys

    def digest(state):
        h = hashlib.sha256()
        for name in sorted(state):
            h.update(name.encode() + state[name].contiguous().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    code = (
        "import hashlib, torch\n"
        "from model.config import get_config\nfrom model.weights import init_pipeline\n"
        "s = init_pipeline(get_config('tiny'), 1234).state_dict()\nh = hashlib.sha256()\n"
        "for n in sorted(s): h.update(n.encode() + s[n].contiguous().view(torch.uint8).numpy().tobytes())\n"
        "print(h.hexdigest())\n"
    )
    repo = Path(__file__).resolve().parents[2]  # python -c puts the cwd on sys.path
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=repo)
    assert out.stdout.strip() == digest(tiny_pipeline.state_dict())
