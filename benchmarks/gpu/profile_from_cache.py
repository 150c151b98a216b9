"""A device profile from calibrations a GPU run cached (``$ACCELBENCH_CACHE_DIR/calibration.json``), for a vendor
plugin to ship (``plugins/<vendor>/accelbench_<vendor>/profiles/``) or a user to pass with ``--profile``.

    python benchmarks/gpu/profile_from_cache.py CACHE.json[:DTYPE] ... --device "NVIDIA H200" --peak bfloat16=989
        [--peak float32=67] --provenance "..." --out PROFILE.json

Each cache file gives the calibration of each DTYPE named (all of its own where none is named) for the device. A
calibration from an older accelbench (version 6: no cold-memory size, no optimizer phase) is read with those left
out. A product timed above the device's datasheet peak (``--peak DTYPE=TFLOPS``) is a timing that did not wait for
the device: its rate is capped at the peak, and the profile's notes say how many were. Nothing is measured here.
``accelbench calibrate --export FILE`` writes a profile directly on the device.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from accelbench.estimate.calibration import CALIBRATION_VERSION, Calibration
from accelbench.estimate.profile import DeviceProfile, write_profile


def calibrations_in(spec: str, device: str, peaks: dict[str, float]) -> list[Calibration]:
    path, _, wanted = spec.partition(":")
    out = []
    for entry in json.loads(Path(path).read_text()).values():
        if device not in entry["key"] or (wanted and entry["dtype"] != wanted):
            continue
        entry = {**entry, "version": CALIBRATION_VERSION}
        capped = 0
        for point in entry["matmul"]:
            peak = peaks.get(point["dtype"])
            if peak is not None and point["best_flops_per_s"] > peak:
                point["best_flops_per_s"], capped = peak, capped + 1
            if peak is not None:
                point["median_flops_per_s"] = min(point["median_flops_per_s"], peak)
        notes = list(entry.get("notes", []))
        if capped:
            notes.append(f"{capped} product(s) timed above the datasheet peak: capped at it")
        entry["notes"] = notes + [f"from {path}"]
        out.append(Calibration.model_validate(entry))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("caches", nargs="+", help="calibration.json[:DTYPE]")
    parser.add_argument("--device", required=True, help="the device's name as detected, e.g. 'NVIDIA H200'")
    parser.add_argument("--device-type", default="cuda")
    parser.add_argument("--backend", default="cuda")
    parser.add_argument(
        "--peak", action="append", default=[], help="DTYPE=TFLOPS, the datasheet's dense peak"
    )
    parser.add_argument("--provenance", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    peaks = {d: float(t) * 1e12 for d, t in (p.split("=") for p in args.peak)}
    calibrations = [c for spec in args.caches for c in calibrations_in(spec, args.device, peaks)]
    if not calibrations:
        raise SystemExit(f"no calibration of {args.device} in {', '.join(args.caches)}")
    torch_version = calibrations[0].key.split("torch ")[-1].split(",")[0]
    profile = DeviceProfile(
        device=args.device,
        device_type=args.device_type,
        backend=args.backend,
        torch=torch_version,
        measured_at=min(c.measured_at for c in calibrations),
        provenance=args.provenance,
        calibrations=calibrations,
    )
    write_profile(profile, args.out)
    print(f"{args.out}: {', '.join(profile.dtypes())} of {args.device}, torch {torch_version}")


if __name__ == "__main__":
    main()
