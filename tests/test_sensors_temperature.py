"""CPU temperatures against fake hwmon and thermal trees."""

from __future__ import annotations

from fakesys import make_hwmon, make_thermal_zone, write_value

from fecomlite.sensors.temperature import discover_temperatures


def test_hwmon_cpu_package_inputs_are_chosen_over_cores_and_other_chips(tmp_path):
    hwmon, thermal = tmp_path / "hwmon", tmp_path / "thermal"
    make_hwmon(hwmon, 0, "nvme", {"Composite": 41850})
    make_hwmon(hwmon, 1, "coretemp", {"Package id 0": 52000, "Core 0": 50000, "Core 1": 51000})
    make_hwmon(hwmon, 2, "coretemp", {"Package id 1": 48500, "Core 0": 47000})
    make_thermal_zone(thermal, 0, "x86_pkg_temp", 52000)  # the same package again: not used
    sensors, notes = discover_temperatures(hwmon, thermal)
    assert [s.name for s in sensors] == [
        "temp:cpu:coretemp:hwmon1:Package id 0", "temp:cpu:coretemp:hwmon2:Package id 1"
    ]
    assert [s.read() for s in sensors] == [52.0, 48.5]
    write_value(hwmon / "hwmon1" / "temp1_input", 55250)
    assert sensors[0].read() == 55.25
    assert all((s.domain, s.unit, s.kind, s.device) == ("temperature", "C", "gauge", "cpu")
               for s in sensors)
    assert notes == []


def test_amd_prefers_tdie_and_unlabelled_chips_give_every_input(tmp_path):
    make_hwmon(tmp_path / "a", 0, "k10temp", {"Tctl": 61000, "Tdie": 51000, "Tccd1": 45000})
    (sensors,), _ = discover_temperatures(tmp_path / "a", tmp_path / "none")
    assert sensors.name.endswith(":Tdie") and sensors.read() == 51.0
    chip = tmp_path / "b" / "hwmon0"
    chip.mkdir(parents=True)
    (chip / "name").write_text("cpu_thermal\n")
    write_value(chip / "temp1_input", 38000)
    (sensor,), _ = discover_temperatures(tmp_path / "b", tmp_path / "none")
    assert sensor.name == "temp:cpu:cpu_thermal:hwmon0:temp1" and sensor.read() == 38.0


def test_thermal_zones_when_hwmon_has_no_cpu_chip(tmp_path):
    make_hwmon(tmp_path / "hwmon", 0, "acpitz", {"temp1": 27800})
    make_thermal_zone(tmp_path / "thermal", 0, "acpitz", 27800)
    make_thermal_zone(tmp_path / "thermal", 1, "x86_pkg_temp", 63000)
    (sensor,), notes = discover_temperatures(tmp_path / "hwmon", tmp_path / "thermal")
    assert sensor.name == "temp:cpu:x86_pkg_temp:thermal_zone1" and sensor.read() == 63.0


def test_no_cpu_temperature_is_a_note_for_the_gate(tmp_path):
    sensors, (note,) = discover_temperatures(tmp_path / "hwmon", tmp_path / "thermal")
    assert sensors == []
    assert note.startswith("no CPU temperature sensor") and "power and utilisation" in note


def test_an_input_that_errors_at_discovery_is_left_out(tmp_path):
    make_hwmon(tmp_path, 0, "coretemp", {"Package id 0": 50000})
    (tmp_path / "hwmon0" / "temp1_input").write_text("")  # as a sensor without data reads
    assert discover_temperatures(tmp_path, tmp_path / "none")[0] == []
