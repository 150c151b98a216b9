"""One line per result record under a folder (read back through accelbench's own validating reader).

python benchmarks/gpu/digest.py FOLDER [--markdown]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from accelbench.errors import ResultFileError
from accelbench.results import check_prediction, read_record

COLUMNS = (
    "set",
    "model",
    "prec",
    "opts",
    "batch",
    "status",
    "warm s",
    "steady s",
    "samples/s",
    "TFLOP/s",
    "MFU",
    "peak GiB",
    "compile s",
    "power W",
    "pred step",
    "pred mem",
)


def row(path: Path, root: Path) -> list[str]:
    r = read_record(path)
    c, m = r.config, r.metrics
    o = c.workload_options
    opts = [
        c.strategy if c.strategy != "single" else "",
        "lightning" if c.engine == "lightning" else "",
        f"compile:{c.compile_mode}" if c.compile else "",
        f"tf32:{c.backend_options['tf32']}" if c.precision == "fp32" and "tf32" in c.backend_options else "",
        f"data:{c.data_placement}" if c.data_placement != "auto" else "",
        f"vocab*{o['vocab_multiple']}" if o.get("vocab_multiple", 64) != 64 else "",
        f"drop:{o['dropout']}" if o.get("dropout", 0.1) != 0.1 else "",
    ]
    steady = m.steady if m else None
    power = None
    if m and len(m.epochs) > 1:
        powers = [
            e.telemetry.get("power_w") for e in m.epochs[1:] if e.telemetry and e.telemetry.get("power_w")
        ]
        power = sum(powers) / len(powers) if powers else None

    check = check_prediction(r)

    def f(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    return [
        str(path.parent.relative_to(root)).removeprefix("records/"),
        c.model,
        c.precision,
        " ".join(o for o in opts if o),
        str(c.batch_size),
        r.outcome.status,
        f(m.warmup.wall_s if m and m.warmup else None, ".3f"),
        f(steady.epoch_s_median if steady else None, ".3f"),
        f(steady.samples_per_s if steady else None, ".0f"),
        f(steady.achieved_flops_per_s / 1e12 if steady else None, ".1f"),
        f(steady.mfu if steady else None, ".3f"),
        f(m.peak_memory_max_bytes / 2**30 if m and m.peak_memory_max_bytes else None, ".2f"),
        f(m.compile_s if m else None, ".1f"),
        f(power, ".0f"),
        # the record's own prediction against what it measured (memory: tensors against the live tensor peak
        # where one was measured, else against the backend's reading)
        f(check.step_error if check else None, "+.1%"),
        f(check.memory_error if check else None, "+.1%"),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", type=Path)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    rows, problems = [], []
    for path in sorted(args.folder.rglob("*.json")):
        if "records" not in path.parts or ".accelbench-points" in path.parts:
            continue
        try:
            rows.append(row(path, args.folder))
        except ResultFileError as exc:
            if "sweep" not in path.name:
                problems.append(f"{path}: {exc}")
    if args.markdown:
        print("| " + " | ".join(COLUMNS) + " |")
        print("|" + "---|" * len(COLUMNS))
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        widths = [max(len(x) for x in col) for col in zip(COLUMNS, *rows, strict=True)]
        for r in [list(COLUMNS), *rows]:
            print(" ".join(x.ljust(w) for x, w in zip(r, widths, strict=True)).rstrip())
    for problem in problems:
        print("unreadable:", problem)
    for name in ("harness-lightning-bf16.json", "ladder-plain-mingpt.json"):
        p = args.folder / name
        if p.exists():
            h = json.loads(p.read_text())
            print(f"{name}: steady epoch {h['steady_epoch_s']} s, {h['steady_samples_per_s']} samples/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
