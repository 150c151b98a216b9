"""``python -m accelbench.references``: regenerate the shipped reference trajectories (accelbench/references/gpt.json)."""

from accelbench.references import REFERENCE_FILE, regenerate

if __name__ == "__main__":
    written = regenerate()
    for model, entry in written["models"].items():
        print(model, {seed: [round(v, 4) for v in losses] for seed, losses in entry["trajectories"].items()})
    print(f"written: {REFERENCE_FILE}")
