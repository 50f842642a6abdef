"""Validation accuracy against wall seconds since the process started, for planned runs and the bare loop: the
picture in docs/recipes.md, and the time each run took to reach an accuracy.

    python bench/experiments/time_to_accuracy.py --run "today's plan=runs/old_s0" --run "new plan=runs/new_s0" \\
        --bare "bare loop=bench/experiments/bare_loop.json" --reach 0.87 --out docs/time_to_accuracy.png

A run folder holds logs/folder/version_0/events.* (TensorBoard, val/acc with its wall time) and a file `start` with
the process's start time (seconds since the epoch, as `date +%s.%N` wrote it just before the command).
"""

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402


def run_curve(folder: Path) -> list[tuple[float, float]]:
    start = float((folder / "start").read_text())
    (events,) = {p.parent for p in folder.glob("logs/*/version_0/events.*")}
    ea = EventAccumulator(str(events), size_guidance={"scalars": 0})
    ea.Reload()
    return [(e.wall_time - start, e.value) for e in ea.Scalars("val/acc")]


def reach(curve: list[tuple[float, float]], level: float) -> float | None:
    return next((t for t, acc in curve if acc >= level), None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", action="append", default=[], help="LABEL=FOLDER of a planned run")
    ap.add_argument("--bare", action="append", default=[], help="LABEL=JSON written by bench/experiments/bare_loop.py")
    ap.add_argument("--reach", type=float, default=0.87)
    ap.add_argument("--out", default="docs/time_to_accuracy.png")
    args = ap.parse_args(argv)
    curves = {}
    for item in args.run:
        label, folder = item.split("=", 1)
        curves[label] = run_curve(Path(folder))
    for item in args.bare:
        label, path = item.split("=", 1)
        curves[label] = [(r["seconds"], r["val_acc"]) for r in json.loads(Path(path).read_text())]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for label, curve in curves.items():
        ax.plot([t for t, _ in curve], [100 * a for _, a in curve], marker=".", label=label)
        t = reach(curve, args.reach)
        best = max(a for _, a in curve)
        print(
            f"{label}: best {100 * best:.2f}% ; reached {100 * args.reach:.0f}% at " + (f"{t:.0f} s" if t else "never")
        )
    ax.axhline(100 * args.reach, color="grey", lw=0.6, ls=":")
    ax.set_xlabel("wall seconds since the command started (decoding and planning included)")
    ax.set_ylabel("validation accuracy, %")
    ax.set_ylim(70, 95)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
