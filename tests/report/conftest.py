"""Report tests never read or write this host's stored A/A calibration."""

import pytest

from pytest_afd.report.noise import CALIBRATION_ENV


@pytest.fixture(autouse=True)
def _no_host_calibration(tmp_path_factory, monkeypatch):
    monkeypatch.setenv(CALIBRATION_ENV, str(tmp_path_factory.mktemp("calib") / "none.json"))
