"""``python -m accelbench.references [WORKLOAD ...]``: regenerate the shipped reference trajectories
(accelbench/references/<workload>.json), every workload's or only those named."""

import sys

from accelbench.references import REFERENCE_DIR, WORKLOADS, regenerate

if __name__ == "__main__":
    asked = tuple(sys.argv[1:]) or tuple(WORKLOADS)
    unknown = [w for w in asked if w not in WORKLOADS]
    if unknown:
        sys.exit(f"no reference recipe for {', '.join(unknown)}; choose from: {', '.join(WORKLOADS)}")
    for workload, written in regenerate(asked).items():
        for model, entry in written["models"].items():
            print(
                model, {seed: [round(v, 4) for v in losses] for seed, losses in entry["trajectories"].items()}
            )
        print(f"written: {REFERENCE_DIR / (workload + '.json')} ({written['made']['seconds']} s)")
