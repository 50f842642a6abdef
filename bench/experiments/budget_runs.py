"""Planned runs, one at a time, each timed from start to exit: the evidence behind docs/recipes.md's budget tables.

python bench/experiments/budget_runs.py OUT.jsonl DATA [DATA ...] --repo . --budget 5min --seeds 0 1 2 [-- EXTRA FLAGS]

Each run is `python REPO/train.py fit --data.root DATA --budget B --seed_everything S [EXTRA]` in a fresh folder
under OUT's folder; a row per run (data, seed, flags, wall seconds, the best score, epochs, the plan's token grid and
model) is appended to OUT as soon as the run ends. `--repo` names the checkout whose code runs (an older commit's
worktree gives the plan of that commit). `--test DIR [DIR ...]`, one folder per DATA (bench/experiments/cv_folds.py's test{k}
beside fold{k}): `vit-eval` scores the run's chosen checkpoint on it (images no part of the run saw), and the row gets
its accuracy and balanced accuracy.
"""

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("data", nargs="+")
    p.add_argument("--repo", default=".")
    p.add_argument("--budget", default="5min")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--source", default="--data.root", help="the flag that names the data (or '--config')")
    p.add_argument("--test", nargs="+", default=[], help="a held-out folder per DATA, scored by vit-eval")
    a = p.parse_args(argv)
    if a.test and len(a.test) != len(a.data):
        p.error(f"--test names {len(a.test)} folder(s) for {len(a.data)} DATA")
    out = Path(a.out).resolve()
    repo = Path(a.repo).resolve()
    for k, data in enumerate(a.data):
        for seed in a.seeds:
            run_dir = out.parent / f"{Path(data).name}_{a.budget}_s{seed}_{int(time.time())}"
            run_dir.mkdir(parents=True)
            cmd = [sys.executable, str(repo / "train.py"), "fit", a.source, str(Path(data).resolve())]
            cmd += ["--budget", a.budget, "--seed_everything", str(seed), "--trainer.enable_progress_bar", "false"]
            cmd += extra
            t = time.time()
            proc = subprocess.run(cmd, cwd=run_dir, capture_output=True, text=True)
            wall = time.time() - t
            log = proc.stdout + proc.stderr
            (run_dir / "log.txt").write_text(log)
            best = re.findall(r"best (val/\S+) ([0-9.]+)", log)
            epochs = re.findall(r"epochs\s+(\d+)\s", log)
            resized = re.findall(r"so (\d+) epochs instead of|ends after (\d+) epochs", log)
            grid = re.search(r"img_size, patch\s+(\d+), (\d+)[^\n]*?(\d+) tokens", log)  # the plan's grid
            model = re.search(r"model\s+(\d+) wide, (\d+) blocks", log)
            row = {
                "data": str(data),
                "seed": seed,
                "budget": a.budget,
                "flags": extra,
                "repo": str(repo),
                "rc": proc.returncode,
                "wall_s": round(wall, 1),
                "best": {best[-1][0]: float(best[-1][1])} if best else None,
                "planned_epochs": int(epochs[0]) if epochs else None,
                "final_epochs": [int(x or y) for x, y in resized][-1:] or None,
                "img_size_patch_tokens": [int(g) for g in grid.groups()] if grid else None,
                "model": [int(m) for m in model.groups()] if model else None,
                "log": str(run_dir / "log.txt"),
            }
            ckpt = re.findall(r"checkpoint: (\S+)", log)
            if a.test and ckpt:
                row["test"] = held_out_score(repo, run_dir, ckpt[-1], a.test[k])
                row["test_tta"] = held_out_score(repo, run_dir, ckpt[-1], a.test[k], "--tta")
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)


def held_out_score(repo: Path, run_dir: Path, ckpt: str, test: str, *flags: str) -> dict:
    """vit-eval of the chosen checkpoint on a held-out folder (with `flags`, e.g. --tta): accuracy, balanced
    accuracy, images."""
    ckpt_path = Path(ckpt) if Path(ckpt).is_absolute() else run_dir / ckpt
    out = run_dir / ("eval" + "".join(f.strip("-") for f in flags))
    cmd = [sys.executable, "-m", "vit.commands.eval", "--ckpt", str(ckpt_path), str(Path(test).resolve()), *flags]
    cmd += ["--out", str(out)]
    proc = subprocess.run(cmd, cwd=repo, capture_output=True, text=True)
    (out.parent / f"{out.name}.txt").write_text(proc.stdout + proc.stderr)
    if proc.returncode:
        return {"rc": proc.returncode}
    m = json.loads((out / "metrics.json").read_text())
    return {k: m.get(k) for k in ("top1", "balanced_accuracy", "n")}


if __name__ == "__main__":
    main()
