"""Device profiles: the rates that price a step's operators on one kind of device, and where they come from.

One step-time model serves every device (:func:`accelbench.estimate.step_time.calibrated_times`: each traced
operator at its kind's rate, a kernel's fixed cost, the host's dispatch, by phase). What differs is where the rates
come from. A :class:`DeviceProfile` holds them (one :class:`~accelbench.estimate.calibration.Calibration` per
matmul dtype) with their provenance, from, in this order (:func:`profile_source_order`):

1. **measured here**: a calibration of the device in front of you (``estimate --calibrate``, a run's own);
2. **a file**: ``--device-profile FILE``, a profile someone measured on that device (``accelbench calibrate --export``);
3. **shipped**: a profile measured on that device and shipped as data by its vendor plugin
   (:meth:`accelbench.contract.Backend.device_profiles`), with who measured it, where, when and with which torch;
4. **datasheet**: derived from the device's datasheet figures (:func:`datasheet_profile`): the peak FLOP/s of each
   math and the memory bandwidth, a matmul's rate by shape from tile and wave quantisation over the device's compute
   units, and the typical fixed costs of a kernel and of the host's dispatch, from micro-benchmarks of an H200
   (:data:`TYPICAL`), never from an end-to-end figure.

Every prediction says which source priced it, and the error band measured for that source against published
measurements (:data:`ERROR_BANDS`, from ``benchmarks/published``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from accelbench.errors import ConfigError
from accelbench.estimate.calibration import (
    ELEMENTWISE_ELEMENTS,
    ELEMENTWISE_KINDS,
    ELEMENTWISE_LARGE_ELEMENTS,
    MATMUL_SIZES,
    STREAM_BYTES,
    STRIDED_KIND,
    Calibration,
    MatmulPoint,
    StreamPoint,
    TiledMatmul,
)
from accelbench.estimate.peak import matmul_dtype
from accelbench.vendors import name_key

if TYPE_CHECKING:
    from accelbench.contract import Backend, DeviceInfo, PrecisionPlan

PROFILE_FORMAT: Literal["accelbench-device-profile"] = "accelbench-device-profile"
PROFILE_VERSION = 1

Source = Literal["measured here", "file", "shipped", "datasheet", "efficiency"]
# a prediction no profile priced: FLOPs at a fraction of the peak (--efficiency, or no profile could be made)
EFFICIENCY_SOURCE: Source = "efficiency"


def profile_source_order() -> tuple[Source, ...]:
    """The sources of a device's rates, the first available taken."""
    return ("measured here", "file", "shipped", "datasheet")


class DeviceProfile(BaseModel):
    """One device's measured (or derived) rates, by matmul dtype, and where they come from."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["accelbench-device-profile"] = PROFILE_FORMAT
    version: int = PROFILE_VERSION
    device: str = Field(description="The device's name as its backend detects it (e.g. 'NVIDIA H200').")
    device_type: str = Field(description="torch's device type: cuda, xpu, cpu, ...")
    backend: str = Field(description="The accelbench backend that measured it.")
    torch: str = Field(description="The torch version it was measured with.")
    measured_at: str
    provenance: str = Field(description="Who measured it, where and how, in words.")
    calibrations: list[Calibration] = Field(description="The rates, one calibration per matmul dtype.")

    def calibration(self, dtype: str) -> Calibration | None:
        """The calibration for matmuls in ``dtype``, or None where the profile has none."""
        return next((c for c in self.calibrations if c.dtype == dtype), None)

    def dtypes(self) -> list[str]:
        return [c.dtype for c in self.calibrations]


@dataclass(frozen=True)
class ResolvedProfile:
    """The calibration that prices a prediction, the source it came from, and that source in words."""

    calibration: Calibration
    source: Source
    described: str

    @property
    def band(self) -> str:
        return error_band(self.source)


# The error of the step-time prediction, by the source of its rates: |predicted / measured - 1| over the published
# measurements a source priced (benchmarks/published/predict.py; docs/measurements/2026-12-07-published.md).
# (median, 90th percentile, how many, what they were); None where no published measurement was priced so.
ERROR_BANDS: dict[Source, tuple[float, float, int, str] | None] = {
    "measured here": (0.06, 0.15, 16, "CPU configurations calibrated within the hour, 2026-12-01"),
    "file": None,
    "shipped": (0.13, 0.32, 11, "H200 runs priced with the profile measured that day"),
    "datasheet": (0.14, 0.57, 15, "figures: seed 000's A100 epochs, accelbench's H100 runs"),
    "efficiency": (0.49, 0.76, 2, "CNN runs on an H100 that no profile prices"),
}


def error_band(source: Source) -> str:
    """The measured error band of predictions priced from ``source``, in words."""
    band = ERROR_BANDS.get(source)
    if band is None:
        return f"{source} rates: no published measurement checked yet, error band unknown"
    median, p90, count, what = band
    return f"{source} rates: step within {median:.0%} at the median, {p90:.0%} at the 90th percentile ({count} {what})"


# --------------------------------------------------------------------------------------------------------------
# Reading and writing profiles
# --------------------------------------------------------------------------------------------------------------


def load_profile(path: Path) -> DeviceProfile:
    """The profile in ``path``; a ConfigError naming the file and what is wrong where it is not one."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"--device-profile {path}: cannot read it ({exc.strerror or exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--device-profile {path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict) or data.get("format") != PROFILE_FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ConfigError(
            f"--device-profile {path}: not an accelbench device profile (format {found!r}, expected {PROFILE_FORMAT!r}); "
            "write one with `accelbench calibrate --export FILE`"
        )
    if data.get("version") != PROFILE_VERSION:
        raise ConfigError(
            f"--device-profile {path}: profile version {data.get('version')!r}, this accelbench reads version "
            f"{PROFILE_VERSION}; export it again with this accelbench"
        )
    try:
        profile = DeviceProfile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"--device-profile {path}: invalid profile at {where}: {first['msg']}") from None
    for calibration in profile.calibrations:
        problem = implausible(calibration)
        if problem:
            raise ConfigError(
                f"--device-profile {path}: {problem}; measure it again with `accelbench calibrate`"
            )
    return profile


def implausible(calibration: Calibration, peak_flops_per_s: float | None = None) -> str | None:
    """Why ``calibration``'s rates are not a measurement of a device (a rate that is not a positive finite number, a
    product faster than the device's datasheet peak), or None."""
    rates = [p.best_flops_per_s for p in calibration.matmul] + [
        p.best_bytes_per_s for p in calibration.stream
    ]
    rates += list(calibration.elementwise.values()) + list(calibration.elementwise_large.values())
    if not rates or any(not (math.isfinite(r) and r > 0) for r in rates):
        return f"the {calibration.dtype} calibration has a rate that is not a positive number"
    if not (math.isfinite(calibration.dispatch_s) and calibration.dispatch_s >= 0):
        return f"the {calibration.dtype} calibration's dispatch cost {calibration.dispatch_s} is not a time"
    if peak_flops_per_s is not None:
        fastest = max(p.best_flops_per_s for p in calibration.matmul if p.dtype == calibration.dtype)
        if fastest > peak_flops_per_s * PEAK_TOLERANCE:
            return (
                f"a {calibration.dtype} product was timed at {fastest / 1e12:.4g} TFLOP/s, above the device's "
                f"datasheet peak of {peak_flops_per_s / 1e12:.4g}: a timing that did not wait for the device"
            )
    return None


# a measured rate may exceed the datasheet peak by this much (boost clocks above the datasheet's) before it is refused
PEAK_TOLERANCE = 1.02


def write_profile(profile: DeviceProfile, path: Path) -> None:
    """Write ``profile`` to ``path`` atomically (a reader never sees half a file)."""
    from accelbench.results import _write_atomically

    _write_atomically(profile.model_dump_json(indent=2) + "\n", Path(path))


def check_profile_device(profile: DeviceProfile, device_name: str, device_type: str, where: str) -> None:
    """Refuse a profile measured on another device than the one predicted for."""
    if profile.device_type != device_type or name_key(profile.device) != name_key(device_name):
        raise ConfigError(
            f"{where}: the profile was measured on {profile.device} ({profile.device_type}), not on the {device_name} "
            f"({device_type}) predicted for; give a profile of that device, or --device {profile.device!r}"
        )


def check_profile_torch(profile: DeviceProfile, where: str) -> None:
    """Refuse a profile measured with another torch release (major.minor) than this one: its dispatch costs and its
    kernels are that release's."""
    import torch

    if _release(profile.torch) != _release(torch.__version__):
        raise ConfigError(
            f"{where}: the profile was measured with torch {profile.torch}, this is torch {torch.__version__}: its "
            "kernels and dispatch costs are another release's; measure one with this torch (`accelbench calibrate "
            "--export FILE` on that device)"
        )


def _release(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


# --------------------------------------------------------------------------------------------------------------
# A profile from the datasheet
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Typical:
    """Figures a datasheet does not give, taken from micro-benchmarks of one device (never from an end-to-end
    figure): what a datasheet profile assumes of a device like it."""

    # of the dense peak, what a large product reaches (cuBLAS on the H200: 790 of 989 TFLOP/s, 8192^3 bf16)
    matmul_efficiency: float
    # of the memory bandwidth, what a large elementwise stream reaches (H200: 4,141 of 4,800 GB/s, 192 MiB add)
    bandwidth_efficiency: float
    # the device time of the smallest kernels, queued back to back (H200: a 2048x32x32 product 1.8 us, a 48 KiB add 1
    # us)
    matmul_kernel_s: float
    elementwise_kernel_s: float
    # the host's eager dispatch per operator: alone, recorded by autograd, within a training step (H200's host,
    # torch 2.11)
    dispatch_s: float
    autograd_dispatch_s: float
    step_dispatch_s: float
    # each elementwise kind's cost in bytes of the memory's bandwidth per element, at 2^20 and 2^24 fp32 elements
    # (H200: its stream rate over the kind's rate)
    kind_bytes: Mapping[str, tuple[float, float]]
    source: str


# From the H200 calibrations of 2026-11-28 (docs/gpu/h200-2026-11-28b/call4/cache/calibration.json) and the
# cuBLAS figure in shared notes; each kind's bytes per element is the 192 MiB stream's 4,141 GB/s over its rate.
_H200_STREAM = 4141e9
_H200_KIND_RATES = {  # Gelem/s at 2^20 and 2^24 elements
    "mask_reduce": (121.8, 380.8),
    "mask_select": (170.8, 312.7),
    "mask_test": (181.0, 839.9),
    "normalisation": (42.7, 80.0),
    "normalisation_backward": (23.9, 99.3),
    "random": (145.0, 583.4),
    "softmax": (149.5, 495.7),
    "softmax_backward": (62.5, 170.4),
    "strided_copy": (154.3, 307.4),
    "transcendental": (165.2, 508.8),
    "transcendental_backward": (125.5, 355.3),
}
TYPICAL = Typical(
    matmul_efficiency=0.80,
    bandwidth_efficiency=4141e9 / 4800e9,
    matmul_kernel_s=1.8e-6,
    elementwise_kernel_s=1.0e-6,
    dispatch_s=10.8e-6,
    autograd_dispatch_s=12.7e-6,
    step_dispatch_s=14.5e-6,
    kind_bytes={
        kind: (_H200_STREAM / (small * 1e9), _H200_STREAM / (large * 1e9))
        for kind, (small, large) in _H200_KIND_RATES.items()
    },
    source="typical fixed costs and kind costs from an H200's micro-benchmarks (2026-11-28, torch 2.11)",
)


def datasheet_profile(
    *,
    device: str,
    device_type: str,
    backend: str,
    peaks: Mapping[str, float],
    bandwidth_bytes_per_s: float,
    compute_units: int | None,
    label: str,
    typical: Typical = TYPICAL,
) -> DeviceProfile:
    """A profile from the datasheet: for each matmul dtype in ``peaks`` (its dense FLOP/s, the math it runs in
    applied: an fp32 product under TF32 at the TF32 peak), a product's rate by shape from tile and wave quantisation
    over ``compute_units`` (:class:`~accelbench.estimate.calibration.TiledMatmul`), elementwise streams at the
    bandwidth with a kernel's fixed time, each elementwise kind at its typical bytes per element, and the host's
    typical dispatch. Marked as derived, not measured."""
    import torch

    stream_rate = bandwidth_bytes_per_s * typical.bandwidth_efficiency

    def streamed(nbytes: float) -> float:
        return nbytes / (nbytes / stream_rate + typical.elementwise_kernel_s)

    def kind_rate(kind: str, elements: int, large: bool) -> float:
        per_element = typical.kind_bytes[kind][1 if large else 0]
        return elements / (elements * per_element / stream_rate + typical.elementwise_kernel_s)

    tiles = TiledMatmul(
        peak_flops_per_s=dict(peaks),
        efficiency=typical.matmul_efficiency,
        compute_units=compute_units,
        kernel_s=typical.matmul_kernel_s,
    )
    calibrations = []
    for dtype in peaks:
        grid = [
            MatmulPoint(dtype=d, m=m, n=n, k=k, best_flops_per_s=rate, median_flops_per_s=rate)
            for d in ([dtype] if dtype == "float32" else [dtype, "float32"])
            if d in peaks
            for m in MATMUL_SIZES
            for n in MATMUL_SIZES
            for k in MATMUL_SIZES
            for rate in (tiles.rate(m, n, k, d),)
        ]
        kinds = [*ELEMENTWISE_KINDS, STRIDED_KIND]
        calibrations.append(
            Calibration(
                key=f"datasheet, {backend}, {device}, {dtype}",
                device_type=device_type,
                dtype=dtype,
                threads=None,
                matmul=grid,
                stream=[
                    StreamPoint(bytes_moved=b, best_bytes_per_s=streamed(b), median_bytes_per_s=streamed(b))
                    for b in STREAM_BYTES
                ],
                elementwise={k: kind_rate(k, ELEMENTWISE_ELEMENTS, False) for k in kinds},
                elementwise_large={k: kind_rate(k, ELEMENTWISE_LARGE_ELEMENTS, True) for k in kinds},
                dispatch_s=typical.dispatch_s,
                autograd_dispatch_s=typical.autograd_dispatch_s,
                step_dispatch_s=typical.step_dispatch_s,
                tiles=tiles,
                measured_at="datasheet",
                seconds=0.0,
                notes=[f"derived from {label}'s datasheet: {typical.source}"],
            )
        )
    return DeviceProfile(
        device=device,
        device_type=device_type,
        backend=backend,
        torch=torch.__version__,
        measured_at="datasheet",
        provenance=(
            f"derived from {label}'s datasheet (dense peaks {', '.join(f'{d} {p / 1e12:g}' for d, p in peaks.items())} "
            f"TFLOP/s, {bandwidth_bytes_per_s / 1e9:g} GB/s"
            + (
                f", {compute_units} compute units"
                if compute_units
                else ", compute units unknown: no wave quantisation"
            )
            + f"); {typical.source}"
        ),
        calibrations=calibrations,
    )


# --------------------------------------------------------------------------------------------------------------
# The profile a prediction is priced with
# --------------------------------------------------------------------------------------------------------------


def file_profile(
    path: Path, device: DeviceInfo, device_type: str, plan: PrecisionPlan, *, local: bool
) -> ResolvedProfile:
    """The calibration in the profile file ``path`` for ``plan``'s matmul dtype, checked to be of ``device``
    (and, for the device here, ``local``, of this torch release); a ConfigError saying what is wrong otherwise."""
    where = f"--device-profile {path}"
    profile = load_profile(path)
    check_profile_device(profile, device.name, device_type, where)
    if local:
        check_profile_torch(profile, where)
    calibration = _calibration_for(profile, plan, where)
    return ResolvedProfile(
        calibration, "file", f"profile {path} ({profile.provenance}; torch {profile.torch})"
    )


def catalogue_profile(
    backend: Backend, device: DeviceInfo, plan: PrecisionPlan, path: Path | None = None
) -> ResolvedProfile | None:
    """The rates for a device of ``backend``'s catalogue, in ``plan``'s precision: the profile in ``path``
    (``--device-profile``), else a profile ``backend`` ships for the device (:meth:`Backend.device_profiles`), else one
    derived from its datasheet (:func:`datasheet_profile`); None where the table has no peak or no memory
    bandwidth for it."""
    if path is not None:
        return file_profile(path, device, backend.info.device_type, plan, local=False)
    for profile in shipped_profiles(backend):
        if name_key(profile.device) != name_key(device.name):
            continue
        calibration = profile.calibration(matmul_dtype(plan))
        if calibration is not None:
            return ResolvedProfile(
                calibration,
                "shipped",
                f"the profile the {backend.name} plugin ships for {profile.device} ({profile.provenance})",
            )
    peak = backend.peak_figures(device, plan)
    if peak is None or not peak.memory_bandwidth_bytes_per_s:
        return None
    from accelbench.contract import standard_plan

    dtype = matmul_dtype(plan)
    peaks = {dtype: peak.flops_per_s}
    if dtype != "float32":  # what autocast leaves in fp32, in the math the plan runs fp32 products in
        fp32 = backend.peak_figures(device, standard_plan("fp32", matmul_math=plan.matmul_math))
        if fp32 is not None:
            peaks["float32"] = fp32.flops_per_s
    units = device.details.get("compute_units")
    label = device.details.get("label", device.name)
    profile = datasheet_profile(
        device=device.name,
        device_type=backend.info.device_type,
        backend=backend.name,
        peaks=peaks,
        bandwidth_bytes_per_s=peak.memory_bandwidth_bytes_per_s,
        compute_units=int(units) if units and units.isdigit() else None,
        label=label,
    )
    calibration = profile.calibration(dtype)
    assert calibration is not None  # made for it
    return ResolvedProfile(calibration, "datasheet", profile.provenance)


def shipped_profiles(backend: Backend) -> list[DeviceProfile]:
    """The profiles ``backend`` ships that this accelbench reads (one it cannot read is left out: a plugin's data
    never breaks a prediction)."""
    out = []
    try:
        texts = backend.device_profiles()
    except Exception:  # noqa: BLE001 - a broken plugin's profiles are left out
        return []
    for text in texts:
        try:
            profile = DeviceProfile.model_validate_json(text)
        except ValidationError:
            continue
        if profile.version == PROFILE_VERSION and not any(implausible(c) for c in profile.calibrations):
            out.append(profile)
    return out


def _calibration_for(profile: DeviceProfile, plan: PrecisionPlan, where: str) -> Calibration:
    dtype = matmul_dtype(plan)
    calibration = profile.calibration(dtype)
    if calibration is None:
        raise ConfigError(
            f"{where}: the profile has rates for {', '.join(profile.dtypes())} products, not for the {dtype} ones "
            f"of {plan.name}; export one calibrated for {plan.name} (`accelbench calibrate --precision {plan.name} "
            "--export FILE`)"
        )
    return calibration
