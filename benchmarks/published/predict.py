"""`accelbench estimate` against measurements others published (and accelbench's own GPU runs), as a centre choosing
hardware would check it: each figure in measurements.toml predicted from its configuration, the errors by the source
of the rates that priced it (measured, shipped, datasheet profile, or a fraction of the peak).

    python benchmarks/published/predict.py [--efficiency E] [--json FILE] [--only ID_PREFIX]

Nothing is run on a device: every prediction is `accelbench estimate --device NAME ... --json`, in this process.
--efficiency prices every configuration the old way (FLOPs at that fraction of the peak), for comparison.
Prints one row per figure, then per source: the median and 90th percentile of |predicted / measured - 1| for times,
the same for memory, each ratio's verdict (the right direction, and within 25% of the measured range), and the fit
verdicts right.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import io
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the core's tomli
    import tomli as tomllib

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
RATIO_TOLERANCE = 0.25


def estimate(argv: list[str], efficiency: float | None) -> dict[str, Any]:
    """The prediction `accelbench estimate ARGV --json` prints, made in this process."""
    from accelbench.cli import main

    extra = ["--efficiency", str(efficiency)] if efficiency is not None else []
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["estimate", *argv, *extra, "--json"])
    if code:
        raise RuntimeError(
            f"accelbench estimate {' '.join(argv)}: exit {code}: {err.getvalue().strip()[-500:]}"
        )
    result: dict[str, Any] = json.loads(out.getvalue())
    return result


def steady_step(record: dict[str, Any]) -> float | None:
    """The median steady step of a record: its epochs after the first, wall time over steps."""
    epochs = (record.get("metrics") or {}).get("epochs") or []
    steps = [e["wall_s"] / e["steps"] for e in epochs[1:] if e.get("steps")]
    return statistics.median(steps) if steps else None


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--efficiency", type=float, help="price at this fraction of the peak (the old model)")
    parser.add_argument("--json", type=Path, help="write every row and the summary here")
    parser.add_argument("--only", default="", help="only the figures whose id starts with this")
    args = parser.parse_args()
    data = tomllib.loads((HERE / "measurements.toml").read_text())
    seed = data["seed000"]
    rows: list[dict[str, Any]] = []

    def stack_of(ident: str) -> list[str]:
        return list(seed["stack"]) if ident.startswith("seed000") else []

    for m in data.get("measurement", []):
        if not m["id"].startswith(args.only):
            continue
        p = estimate(["--device", m["device"], *stack_of(m["id"]), *m["args"]], args.efficiency)
        metric, value = m["metric"], m["value"]
        if metric == "epoch_s":
            predicted = seed["samples"] / p["samples_per_s"] if p["samples_per_s"] else None
        elif metric == "peak_mib":
            predicted = p["peak_memory_bytes"] / 2**20 if p["peak_memory_bytes"] else None
        elif metric == "fits":
            predicted = None if p["fits"] is None else float(p["fits"])
        else:
            raise SystemExit(f"{m['id']}: unknown metric {metric!r}")
        rows.append({"id": m["id"], "kind": "fit" if metric == "fits" else "memory" if metric == "peak_mib" else "time",
                     "source": m["source"], "rates": p.get("rates_source"), "metric": metric,
                     "predicted": predicted, "measured": value})  # fmt: skip
    for r in data.get("ratio", []):
        if not r["id"].startswith(args.only):
            continue
        device = ["--device", r["device"]] if "device" in r else []
        slow, fast = (
            estimate([*device, *stack_of(r["id"]), *r["args"], *extra], args.efficiency)
            for extra in (r["slower"], r["faster"])
        )
        ratio = (
            fast["samples_per_s"] / slow["samples_per_s"]  # the job's samples/s: time per sample, any batch
            if slow["samples_per_s"] and fast["samples_per_s"]
            else None
        )
        rows.append({"id": r["id"], "kind": "ratio", "source": r["source"], "rates": slow.get("rates_source"),
                     "metric": "ratio", "predicted": ratio, "measured": r["measured"]})  # fmt: skip
    for spec in data.get("record", []):
        for path in sorted(glob.glob(str(ROOT / spec["glob"]))):
            record = json.loads(Path(path).read_text())
            measured = steady_step(record)
            if (record.get("outcome") or {}).get("status") != "ok" or measured is None:
                continue
            ident = str(Path(path).relative_to(ROOT))
            if not ident.startswith(args.only) and not Path(path).name.startswith(args.only):
                continue
            p = estimate(["--config", path, "--device", spec["device"]], args.efficiency)
            rows.append({"id": ident, "kind": "time", "source": "accelbench's own run", "rates": p.get("rates_source"),
                         "metric": "step_s", "predicted": p["step_time_s"], "measured": measured})  # fmt: skip
    summary = summarise(rows)
    show(rows, summary)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "summary": summary}, indent=2) + "\n")


def error(row: dict[str, Any]) -> float | None:
    """predicted / measured - 1 (a ratio: against the nearer end of the measured range, 0 inside it)."""
    predicted, measured = row["predicted"], row["measured"]
    if predicted is None:
        return None
    if row["kind"] == "ratio":
        low, high = measured
        nearer = low if predicted < low else high if predicted > high else predicted
        return predicted / nearer - 1.0
    if row["kind"] == "fit":
        return 0.0 if predicted == measured else 1.0
    return float(predicted) / float(measured) - 1.0


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for row in rows:
        row["error"] = error(row)
    for kind in ("time", "memory"):
        by_source: dict[str, list[float]] = {}
        for row in rows:
            if row["kind"] == kind and row["error"] is not None:
                by_source.setdefault(row["rates"] or "-", []).append(abs(row["error"]))
        out[kind] = {
            source: {"n": len(errs), "median": statistics.median(errs), "p90": percentile(errs, 0.9)}
            for source, errs in sorted(by_source.items())
        }
    ratios = [r for r in rows if r["kind"] == "ratio"]
    out["ratios"] = {
        "n": len(ratios),
        "right_direction": sum(1 for r in ratios if r["predicted"] is not None and r["predicted"] > 1.0),
        "within_25pct": sum(
            1 for r in ratios if r["error"] is not None and abs(r["error"]) <= RATIO_TOLERANCE
        ),
    }
    fits = [r for r in rows if r["kind"] == "fit"]
    out["fits"] = {"n": len(fits), "right": sum(1 for r in fits if r["error"] == 0.0)}
    return out


def show(rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    print(f"{'figure':58} {'rates':10} {'predicted':>11} {'measured':>13} {'error':>7}")
    for r in rows:
        measured = r["measured"]
        shown = f"{measured[0]:.3g}-{measured[1]:.3g}" if isinstance(measured, list) else f"{measured:.4g}"
        predicted = "-" if r["predicted"] is None else f"{r['predicted']:.4g}"
        err = "-" if r["error"] is None else f"{r['error']:+.0%}"
        print(f"{r['id'][-58:]:58} {str(r['rates'])[:10]:10} {predicted:>11} {shown:>13} {err:>7}")
    print()
    for kind in ("time", "memory"):
        for source, s in summary[kind].items():
            print(
                f"{kind:6} {source:14} n={s['n']:3}  median |error| {s['median']:.0%}  90th percentile {s['p90']:.0%}"
            )
    ratios, fits = summary["ratios"], summary["fits"]
    print(f"ratios: {ratios['right_direction']} of {ratios['n']} in the right direction, "
          f"{ratios['within_25pct']} within 25% of the measured range")  # fmt: skip
    print(f"fit verdicts: {fits['right']} of {fits['n']} right")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
