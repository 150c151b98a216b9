"""Devices by name from the installed plugins' peak tables: a system you do not have (``--device H100``).

Each backend plugin lists the devices its table knows through ``accelbench_known_devices``, as its detection would
report them (so its ``accelbench_peak_figures`` answers for them), with their datasheet memory, a label and short
names. A name matches when it equals, ignoring case, spaces and punctuation, a device's reported name, label or
one of its short names; failing that, when it is part of exactly one device's names.

A device from a catalogue is not here, so a backend whose ``precision_plan`` asks the device (the CUDA plugin reads
its compute capability) cannot make the plan for it that way. Such a backend also implements
:class:`CataloguePlanner`: the plan for one of its catalogue's devices, made from what the catalogue says of it
(its architecture) and the run's backend options (a TF32 policy), setting no switch (nothing runs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from accelbench.contract import DeviceInfo, PrecisionPlan, Scalar
from accelbench.errors import ConfigError
from accelbench.vendors import name_key

if TYPE_CHECKING:
    from accelbench.contract import Backend
    from accelbench.plugins import PluginHost


@runtime_checkable
class CataloguePlanner(Protocol):
    """A backend that makes its precision plan for a device of its catalogue without the device (``accelbench
    estimate --device NAME``): the plan ``precision_plan`` would make on that device with these backend options
    (TF32 math and all), without applying any global switch. ConfigError for options that cannot work."""

    def catalogue_precision_plan(
        self, precision: str, device: DeviceInfo, options: Mapping[str, Scalar]
    ) -> PrecisionPlan: ...


@dataclass(frozen=True)
class KnownDevice:
    """A device from a backend's catalogue."""

    backend: Backend
    device: DeviceInfo

    @property
    def names(self) -> list[str]:
        """Its short names, label and reported name, the first being what listings show."""
        aliases = [a.strip() for a in self.device.details.get("aliases", "").split(",") if a.strip()]
        label = self.device.details.get("label")
        return [*aliases, *([label] if label else []), self.device.name]

    @property
    def shown(self) -> str:
        memory = f", {self.device.memory_bytes / 2**30:g} GiB" if self.device.memory_bytes else ""
        return f"{self.names[0]} ({self.backend.name}: {self.device.details.get('label', self.device.name)}{memory})"


def known_devices(host: PluginHost) -> list[KnownDevice]:
    """Every device the installed backends' catalogues know, backend by backend (detection priority order). A
    plugin whose catalogue fails is skipped: a listing never fails for one plugin's fault."""
    out = []
    for backend in host.backends.values():
        try:
            devices = backend.known_devices()
        except Exception:  # noqa: BLE001 - a broken catalogue is left out, not raised
            continue
        out += [KnownDevice(backend, device) for device in devices]
    return out


def find_device(host: PluginHost, name: str) -> KnownDevice:
    """The device ``name`` means; ConfigError listing the known names when it matches none, or the candidates when
    it matches several."""
    known = known_devices(host)
    wanted = name_key(name)
    exact = [k for k in known if wanted in {name_key(n) for n in k.names}]
    if len(exact) == 1:
        return exact[0]
    partial = exact or [k for k in known if wanted and any(wanted in name_key(n) for n in k.names)]
    if len(partial) == 1:
        return partial[0]
    if partial:
        raise ConfigError(
            f"--device {name!r} matches several devices: {'; '.join(k.shown for k in partial)}; give one of "
            "their names"
        )
    from accelbench.vendors import plugin_knowing

    vendor = plugin_knowing(name)
    installed = {k.backend.name for k in known}
    if vendor is not None and vendor.backend not in installed:
        raise ConfigError(
            f"--device {name!r}: the {vendor.distribution} plugin's table knows it ({vendor.hardware}), and that "
            f"plugin is not loaded here (not installed, or left out by ACCELBENCH_PLUGINS): {vendor.install} "
            "(from a clone of accelbench), then ask again"
        )
    listing = "; ".join(k.shown for k in known) or "none (no installed plugin lists its devices)"
    raise ConfigError(
        f"--device {name!r}: no installed plugin's peak table knows it; known devices: {listing}"
    )
