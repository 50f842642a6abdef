"""Planned runs from labels files, arms interleaved: for each labels file (a fold; its seed is its position), each arm's
`python REPO/train.py fit --data.root ROOT --data.labels FILE --budget B --seed_everything K ARM` in a fresh folder,
one at a time; a row per run (file, seed, arm, wall seconds, epochs, the test split's metrics from test_metrics.json)
is appended to OUT as soon as the run ends.

    python bench/experiments/labels_runs.py runs.jsonl cells_csv cells_csv/labels_fold{0,1,2}.csv --budget 5min \
        --arm soft "--data.soft_labels true" --arm hard "--data.soft_labels false"
"""

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import yaml


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("root")
    p.add_argument("labels", nargs="+")
    p.add_argument("--repo", default=".")
    p.add_argument("--budget", default="5min")
    p.add_argument("--arm", nargs=2, action="append", metavar=("NAME", "FLAGS"), required=True)
    a = p.parse_args()
    out, repo = Path(a.out).resolve(), Path(a.repo).resolve()
    for seed, labels in enumerate(a.labels):
        arms = a.arm if seed % 2 == 0 else a.arm[::-1]  # alternate which arm runs first: the machine's drift shared
        for name, flags in arms:
            folder = out.parent / f"{out.stem}_{Path(labels).stem}_{name}"
            folder.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, str(repo / "train.py"), "fit", "--data.root", str(Path(a.root).resolve())]
            cmd += ["--data.labels", str(Path(labels).resolve()), "--budget", a.budget, "--seed_everything", str(seed)]
            cmd += ["--trainer.enable_progress_bar", "false", *shlex.split(flags)]
            start = time.perf_counter()
            run = subprocess.run(cmd, cwd=folder, capture_output=True, text=True)
            wall = time.perf_counter() - start
            (folder / "stdout.txt").write_text(run.stdout + run.stderr)
            logs = sorted((folder / "logs" / "folder").glob("version_*"), key=lambda d: d.stat().st_mtime)[-1]
            plan = yaml.safe_load((logs / "plan.yaml").read_text())
            row = {
                "labels": labels,
                "seed": seed,
                "arm": name,
                "flags": flags,
                "budget": a.budget,
                "wall_s": round(wall, 1),
                "returncode": run.returncode,
                "max_epochs": plan["trainer"]["max_epochs"],
                "test": json.loads((logs / "test_metrics.json").read_text()),
            }
            with open(out, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
