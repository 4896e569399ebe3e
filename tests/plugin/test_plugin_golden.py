"""Tolerance profiles and the golden store: pass, fail, update, missing, corrupt."""

import json

import numpy as np
import pytest
import torch

from pytest_afd.golden.store import (
    PROFILES,
    W8A8_ATOL,
    GoldenCorruptError,
    GoldenMismatchError,
    GoldenMissingError,
    GoldenStore,
    compare,
)


def test_plugin_profiles_registered():
    assert set(PROFILES) == {"exact", "float32", "bfloat16", "w8a8", "topk_logprob"}
    assert PROFILES["float32"].rtol == 1.3e-6 and PROFILES["bfloat16"].rtol == 1.6e-2


def test_plugin_exact_profile_reports_positions():
    ok = compare(np.array([1, 2, 3]), [1, 2, 3], "exact")
    assert ok.ok
    bad = compare(np.array([[1, 2], [3, 4]]), np.array([[1, 2], [9, 4]]), "exact")
    assert not bad.ok and bad.num_mismatched == 1
    assert "1 of 4 elements differ" in bad.report and "(1, 0): 3 != 9" in bad.report


def test_plugin_close_profiles_report_max_errors():
    expected = np.linspace(1.0, 2.0, 10, dtype=np.float32)
    assert compare(expected + 1e-7, expected, "float32").ok
    actual = expected.copy()
    actual[7] += 0.5
    actual[2] += 0.01
    result = compare(actual, expected, "float32")
    assert not result.ok and result.num_mismatched == 2
    assert result.max_abs_error == pytest.approx(0.5, rel=1e-5)
    assert "max abs error 0.5 at (7,)" in result.report and "2 of 10 elements exceed float32" in result.report
    assert compare(expected * (1 + 1e-2), expected, "bfloat16").ok
    assert not compare(expected * (1 + 1e-2), expected, "float32").ok
    assert compare(expected + W8A8_ATOL / 2, expected, "w8a8").ok


def test_plugin_nan_and_shape_mismatch_fail():
    assert not compare(np.array([np.nan]), np.array([np.nan]), "float32").ok
    shape = compare(np.zeros(3), np.zeros(4), "float32")
    assert not shape.ok and "shape (3,) != expected shape (4,)" in shape.report


def test_plugin_torch_tensors_including_bfloat16():
    value = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    assert compare(value, np.arange(6, dtype=np.float32).reshape(2, 3), "bfloat16").ok


def test_plugin_topk_logprob_profile():
    golden = np.array([[5.0, 4.9, 0.0, -1.0], [0.0, 1.0, 9.0, 2.0]])
    swapped = np.array([[4.9, 5.0, 0.0, -1.0], [0.0, 1.0, 9.0, 2.0]])
    assert compare(swapped, golden, "topk_logprob").ok
    far = np.array([[5.0, 4.9, 0.0, -1.0], [9.0, 1.0, 0.0, 2.0]])
    from pytest_afd.golden.store import ToleranceProfile

    result = compare(far, golden, ToleranceProfile("top2", "topk", topk=2))
    assert not result.ok and "row 1: token 0 vs golden 2" in result.report


def test_plugin_unknown_profile():
    with pytest.raises(ValueError, match="unknown tolerance profile 'fp8'"):
        compare([1.0], [1.0], "fp8")


def test_plugin_store_missing_update_pass_fail(tmp_path):
    store = GoldenStore(tmp_path)
    logits = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)
    with pytest.raises(GoldenMissingError, match="--afd-update-golden"):
        store.check("gate/logits", logits)
    updater = GoldenStore(tmp_path, update=True, manifest_digest=lambda: "sha256:" + "0" * 64)
    assert updater.check("gate/logits", logits).ok
    assert updater.updated == ["gate/logits"]
    sidecar = json.loads((tmp_path / "gate" / "logits.json").read_text())
    assert sidecar["manifest_digest"] == "sha256:" + "0" * 64 and sidecar["shape"] == [2, 16]
    assert store.check("gate/logits", logits + 1e-7).ok
    with pytest.raises(GoldenMismatchError, match="golden 'gate/logits': 1 of 32 elements exceed"):
        bumped = logits.copy()
        bumped[1, 3] += 1.0
        store.check("gate/logits", bumped)
    assert sorted(p.name for p in (tmp_path / "gate").iterdir()) == ["logits.json", "logits.npz"]


def test_plugin_store_live_reference(tmp_path):
    store = GoldenStore(tmp_path)
    assert store.check("unused", [1, 2], profile="exact", reference=[1, 2]).ok
    with pytest.raises(GoldenMismatchError):
        store.check("unused", [1, 2], profile="exact", reference=[1, 3])
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("damage", ["truncate_npz", "edit_npz", "drop_sidecar", "bad_json", "no_sha"])
def test_plugin_store_corrupt_golden_is_an_error(tmp_path, damage):
    GoldenStore(tmp_path, update=True).check("tokens", np.arange(10), profile="exact")
    npz, sidecar = tmp_path / "tokens.npz", tmp_path / "tokens.json"
    if damage == "truncate_npz":
        npz.write_bytes(npz.read_bytes()[:20])
    elif damage == "edit_npz":
        data = bytearray(npz.read_bytes())
        data[-30] ^= 0xFF
        npz.write_bytes(bytes(data))
    elif damage == "drop_sidecar":
        sidecar.unlink()
    elif damage == "bad_json":
        sidecar.write_text("{not json")
    else:
        sidecar.write_text("{}")
    with pytest.raises(GoldenCorruptError, match="golden 'tokens'"):
        GoldenStore(tmp_path).check("tokens", np.arange(10), profile="exact")


def test_plugin_store_unreadable_npz_with_matching_checksum(tmp_path):
    import hashlib

    (tmp_path / "x.npz").write_bytes(b"not a zip")
    (tmp_path / "x.json").write_text(json.dumps({"sha256": hashlib.sha256(b"not a zip").hexdigest(),
                                                 "dtype": "int64", "shape": [2]}))
    with pytest.raises(GoldenCorruptError, match="cannot read"):
        GoldenStore(tmp_path).load("x")


def test_plugin_store_rejects_bad_names(tmp_path):
    with pytest.raises(ValueError, match=r"golden name '\.\./x'"):
        GoldenStore(tmp_path).check("../x", [1])


def test_plugin_store_safetensors_round_trip(tmp_path):
    logits = np.arange(12, dtype=np.float32).reshape(3, 4)
    GoldenStore(tmp_path, update=True, file_format="safetensors").check("l", logits)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != ".afd-golden.lock") == [
        "l.json", "l.safetensors"]
    # Reading follows the sidecar's format whatever the store writes.
    assert GoldenStore(tmp_path).check("l", logits).ok
    with pytest.raises(GoldenMismatchError):
        GoldenStore(tmp_path).check("l", logits + 1)
    (tmp_path / "l.json").unlink()
    with pytest.raises(GoldenCorruptError, match=r"l\.json is missing next to .*l\.safetensors"):
        GoldenStore(tmp_path).check("l", logits)
    with pytest.raises(ValueError, match="file_format='pt'"):
        GoldenStore(tmp_path, file_format="pt")


def test_plugin_store_unknown_sidecar_format(tmp_path):
    GoldenStore(tmp_path, update=True).check("t", [1, 2], profile="exact")
    sidecar = json.loads((tmp_path / "t.json").read_text())
    sidecar["format"] = "pickle"
    (tmp_path / "t.json").write_text(json.dumps(sidecar))
    with pytest.raises(GoldenCorruptError, match="'pickle' is not one of"):
        GoldenStore(tmp_path).check("t", [1, 2], profile="exact")


@pytest.mark.parametrize("file_format", ["npz", "safetensors"])
@pytest.mark.parametrize(
    ("key", "wrong", "message"),
    [
        ("dtype", "float64", "sidecar dtype 'float64' does not match .*'float32'"),
        ("shape", [4, 3], r"sidecar shape \[4, 3\] does not match .*\[3, 4\]"),
        ("shape", None, r"sidecar shape None does not match"),
    ],
)
def test_plugin_store_sidecar_dtype_and_shape_must_describe_the_array(tmp_path, file_format, key,
                                                                       wrong, message):
    logits = np.arange(12, dtype=np.float32).reshape(3, 4)
    GoldenStore(tmp_path, update=True, file_format=file_format).check("l", logits)
    sidecar_path = tmp_path / "l.json"
    sidecar = json.loads(sidecar_path.read_text())
    assert GoldenStore(tmp_path).check("l", logits).ok  # untouched, it loads
    if wrong is None:
        del sidecar[key]
    else:
        sidecar[key] = wrong
    sidecar_path.write_text(json.dumps(sidecar))  # the checksum still matches the data file
    with pytest.raises(GoldenCorruptError, match=f"golden 'l': {message}"):
        GoldenStore(tmp_path).check("l", logits)
