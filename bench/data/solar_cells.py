"""Real 300-px photos for development: the training side of ELPV, electroluminescence images of solar cells.

    pip download --no-deps -d wheels elpv-dataset==1.0.0.post1      # the wheel ships the 2,624 PNGs (91 MB)
    python bench/data/solar_cells.py wheels/elpv_dataset-1.0.0.post1-py3-none-any.whl cells2      # 2 classes
    python bench/data/solar_cells.py wheels/elpv_dataset-1.0.0.post1-py3-none-any.whl cells4 --classes 4

Deitsch et al. (Solar Energy, 2019): 2,624 cells of 300x300 8-bit grey, each labelled with the probability that it is
defective (0, 1/3, 2/3, 1) and its type (mono- or polycrystalline). The paper holds out 25%, stratified by label and
type; this script writes only the other 75% (1,970 cells) as OUT/<class>/<type>_cellNNNN.png, so that the held-out
quarter stays unseen: do not decide anything on it. Split it further yourself (cross-validate: it is small).
2 classes: functional (p < 0.5) and defective; 4 classes: functional, possibly_defective, likely_defective, defective.
Published on the held-out quarter: SVM 82.4%, ImageNet-pretrained VGG-19 88.4% (accuracy); the majority class 68.7%.
Licence: CC BY-NC-SA 4.0 (research use).
"""

import argparse
import zipfile
from collections import defaultdict
from pathlib import Path

import numpy as np

NAMES4 = {
    "0.0": "functional",
    "0.3333333333333333": "possibly_defective",
    "0.6666666666666666": "likely_defective",
    "1.0": "defective",
}

p = argparse.ArgumentParser()
p.add_argument("wheel")
p.add_argument("out")
p.add_argument("--classes", type=int, choices=(2, 4), default=2)
a = p.parse_args()
rng = np.random.default_rng(0)  # the paper-style split: 25% of each (label, type) group held out, seeded
with zipfile.ZipFile(a.wheel) as z:
    rows = [line.split() for line in z.read("elpv_dataset/data/labels.csv").decode().splitlines() if line.strip()]
    groups = defaultdict(list)
    for path, prob, kind in rows:
        groups[(prob, kind)].append(path)
    n = defaultdict(int)
    for (prob, kind), paths in sorted(groups.items()):
        paths = sorted(paths)
        held_out = set(rng.choice(paths, size=round(len(paths) * 0.25), replace=False))
        for path in paths:
            if path in held_out:
                continue
            cls = NAMES4[prob] if a.classes == 4 else ("defective" if float(prob) >= 0.5 else "functional")
            d = Path(a.out) / cls
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{kind}_{Path(path).name}").write_bytes(z.read(f"elpv_dataset/data/{path}"))
            n[cls] += 1
print(dict(n), "written; the held-out quarter (654 cells) is not")
