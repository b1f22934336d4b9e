"""The reference location's sensors start RUNNING unless ``PRIMUS_SENSORS=stopped``; another value is an error."""

from __future__ import annotations

import pytest
from dagster import DefaultSensorStatus

import sensors


def test_the_reference_sensors_start_as_primus_sensors_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(sensors.SENSORS_ENV, raising=False)
    assert sensors.default_sensor_status() == DefaultSensorStatus.RUNNING
    monkeypatch.setenv(sensors.SENSORS_ENV, " Stopped ")
    assert sensors.default_sensor_status() == DefaultSensorStatus.STOPPED
    monkeypatch.setenv(sensors.SENSORS_ENV, "paused")
    with pytest.raises(ValueError, match=r"\$PRIMUS_SENSORS='paused': choose running or stopped"):
        sensors.default_sensor_status()
