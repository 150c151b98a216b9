"""``accelbench calibrate``: measure this device's rates (the calibration every prediction here is priced with), show
them, and with ``--export FILE`` write them as a device profile another machine can predict with (``estimate
--device NAME --device-profile FILE``) or a vendor plugin can ship (:meth:`accelbench.contract.Backend.device_profiles`).

A profile is written only from a calibration measured on a quiet host whose rates are a device's (none above the
datasheet peak): a contended measurement is kept in this host's cache, marked, and measured again next time, but
never exported. Exporting to an existing profile of the same device and torch adds this precision's calibration to
it (one file holds bf16 and fp32, say); a file that is not such a profile is refused, not overwritten.
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path
from typing import TYPE_CHECKING

from accelbench.errors import ConfigError
from accelbench.exitcodes import ExitCode

if TYPE_CHECKING:
    from rich.console import Console

    from accelbench.estimate.profile import DeviceProfile


def add_calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend", metavar="NAME", help="the backend whose device to calibrate (default: detected)"
    )
    parser.add_argument("--precision", default="fp32",
                        help="the precision whose products to time (their matmul dtype, and fp32; default: fp32)")  # fmt: skip
    parser.add_argument("--devices", type=int, default=1, metavar="N",
                        help="on a CPU: the worker processes a run would start, whose share of the cores each "
                             "process's threads get (default: 1)")  # fmt: skip
    parser.add_argument(
        "--refresh", action="store_true", help="measure again, ignoring the cached calibration"
    )
    parser.add_argument("--export", type=Path, metavar="FILE",
                        help="write the calibration as a device profile (JSON), with its provenance")  # fmt: skip
    parser.add_argument("--provenance", default="",
                        help="with --export: who measured it and where, in words (added to what accelbench "
                             "records: host, device, torch, date)")  # fmt: skip


def calibrate_command(args: argparse.Namespace, err: Console) -> int:
    """Measure (or read from the cache) the calibration of the device here for ``--precision``; show it; export."""
    import torch

    from accelbench.cli import make_config
    from accelbench.estimate.command import resolve_target
    from accelbench.estimate.profile import DeviceProfile, implausible, write_profile
    from accelbench.plugins import get_host

    if args.devices < 1:
        raise ConfigError(f"--devices {args.devices}: give the worker processes of a run, 1 or more")
    existing = _existing(args.export) if args.export is not None else None
    host = get_host()
    values = {"precision": args.precision, "devices": args.devices}
    if args.backend:
        values["backend"] = args.backend
    config = make_config(values)
    target = resolve_target(host, config, calibrate=True, refresh_calibration=args.refresh)
    calibration, device = target.calibration, target.device
    assert (
        calibration is not None and device is not None
    )  # calibrate=True measures one for the detected device
    print(calibration.describe(), flush=True)
    for note in calibration.notes:
        print(f"  - {note}", flush=True)
    if args.export is None:
        return ExitCode.OK
    if calibration.contended:
        raise ConfigError(
            f"--export {args.export}: this calibration was measured while the host was busy (threads waited for a "
            "core, or the hypervisor took the cores' time): its rates are a lower bound, not the device's; it is "
            "not exported. Measure again on a quiet host: accelbench calibrate --refresh --export FILE"
        )
    problem = implausible(calibration, target.peak.flops_per_s if target.peak is not None else None)
    if problem:
        raise ConfigError(f"--export {args.export}: {problem}; measure again (--refresh)")
    backend = host.select_backend(config.backend)
    provenance = (
        f"measured by `accelbench calibrate` on {platform.node() or 'a host'} ({platform.processor() or platform.machine()}), "
        f"{device.name}, torch {torch.__version__}, {calibration.measured_at}"
        + (f"; {args.provenance}" if args.provenance else "")
    )
    if existing is not None:
        if existing.device != device.name or existing.torch != torch.__version__:
            raise ConfigError(
                f"--export {args.export}: the file is a profile of {existing.device} with torch {existing.torch}, "
                f"this is {device.name} with torch {torch.__version__}: export to another file"
            )
        kept = [c for c in existing.calibrations if c.dtype != calibration.dtype]
        profile = existing.model_copy(update={"calibrations": [*kept, calibration],
                                              "provenance": f"{existing.provenance}; {provenance}"})  # fmt: skip
    else:
        profile = DeviceProfile(
            device=device.name,
            device_type=calibration.device_type,
            backend=backend.name,
            torch=torch.__version__,
            measured_at=calibration.measured_at,
            provenance=provenance,
            calibrations=[calibration],
        )
    write_profile(profile, args.export)
    print(f"wrote {args.export}: {', '.join(profile.dtypes())} products of {device.name}", flush=True)
    return ExitCode.OK


def _existing(path: Path) -> DeviceProfile | None:
    """The profile already in ``path`` (to add to), None where there is no file; a file that is not a profile is
    refused before anything is measured."""
    from accelbench.estimate.profile import load_profile

    if not path.exists():
        if not path.parent.is_dir():
            raise ConfigError(f"--export {path}: no folder {path.parent}")
        return None
    try:
        return load_profile(path)
    except ConfigError as exc:
        raise ConfigError(
            f"--export {path}: the file exists and is not a device profile this accelbench reads "
            f"({str(exc).split(': ', 1)[-1]}): give a new file name"
        ) from None
