"""accelbench-example's own rules: test your tables, mappings and errors here, against faithful stand-ins of your
vendor library where the hardware is absent (accelbench's plugins/gaudi/tests and plugins/cuda/tests are examples)."""

from __future__ import annotations

from accelbench.contract import DeviceInfo, standard_plan
from accelbench.plugins import PluginHost


def test_the_plugin_is_found_through_its_entry_point() -> None:
    host = PluginHost()
    record = next(r for r in host.records if r.name == "example")
    assert (record.status, record.contract) == ("active", "3.3")
    assert record.distribution == "accelbench-example"
    assert host.backends["example"].info.device_type == "cpu"


def test_an_explicit_backend_selects_it() -> None:
    assert PluginHost().select_backend("example").name == "example"


def test_a_device_missing_from_the_peak_table_has_no_figure() -> None:
    backend = PluginHost().backends["example"]
    unknown = DeviceInfo(index=0, name="a device the table does not list")
    assert backend.peak_figures(unknown, standard_plan("fp32", "ieee-fp32")) is None
