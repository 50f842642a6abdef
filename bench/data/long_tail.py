"""Make a long-tailed and/or label-noisy copy of a train/val image folder, for developing recipes on imbalanced data.

The CIFAR-10-LT protocol (Cao et al. 2019): training class i (in a seeded shuffled order) keeps
n_max * ratio^(-i/(C-1)) images, so the largest class has `ratio` times the smallest; val/ is copied unchanged
(balanced), so top-1 there is balanced accuracy. With --noise, that share of the kept training files is moved to a
random other class folder; noise.json lists the moved files as {relative path: true class} to score a label-issue
finder. Usage: python long_tail.py SRC OUT --ratio 100 [--noise 0.05] [--seed 0]   (SRC has train/ and val/)
"""

import argparse
import json
import os
import random
import shutil
from pathlib import Path


def main():
    p = argparse.ArgumentParser()
    p.add_argument("src")
    p.add_argument("out")
    p.add_argument("--ratio", type=float, default=100.0)
    p.add_argument("--noise", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rng = random.Random(a.seed)
    src, out = Path(a.src), Path(a.out)
    classes = sorted(d.name for d in (src / "train").iterdir() if d.is_dir())
    order = classes[:]
    rng.shuffle(order)
    files = {c: sorted((src / "train" / c).iterdir()) for c in classes}
    n_max = max(len(v) for v in files.values())
    C = len(classes)
    kept = {}
    for i, c in enumerate(order):
        n = max(1, int(round(n_max * a.ratio ** (-i / (C - 1)))))
        kept[c] = rng.sample(files[c], min(n, len(files[c])))
    noise = {}
    for c in classes:
        d = out / "train" / c
        d.mkdir(parents=True, exist_ok=True)
    for c, fs in kept.items():
        for f in fs:
            target = c
            if a.noise and rng.random() < a.noise:
                target = rng.choice([k for k in classes if k != c])
            dst = out / "train" / target / f.name
            shutil.copyfile(f, dst)
            if target != c:
                noise[str(dst.relative_to(out))] = c
    shutil.copytree(src / "val", out / "val", dirs_exist_ok=True)
    counts = {c: len(os.listdir(out / "train" / c)) for c in classes}
    json.dump(
        {"counts": counts, "order": order, "ratio": a.ratio, "noise": noise}, open(out / "noise.json", "w"), indent=1
    )
    print(json.dumps(counts), len(noise), "moved")


if __name__ == "__main__":
    main()
