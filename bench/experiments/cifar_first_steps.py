"""`python train.py --trainer.max_steps 3` as a new user runs it: CIFAR-10 archives in torchvision's exact format
(10,000 training and 2,000 test images, random pixels: the speed does not depend on them), configs/cifar10.yaml as
shipped. Prints, from the command's own output and the clock: the precision it chose, the seconds to the data loaded,
to the third step (the estimate line after it), to `Trainer.fit` stopped, and each step after fit as it says.

    python bench/experiments/cifar_first_steps.py OUT                                  # precision: auto
    python bench/experiments/cifar_first_steps.py OUT --flags --trainer.precision 32-true

One JSON line a run, appended to OUT/runs.jsonl (docs/performance.md, "Precision by machine").
"""

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--flags", nargs=argparse.REMAINDER, default=[])
    a = ap.parse_args()
    out = Path(a.out)
    if not (out / "data" / "cifar-10-batches-py").is_dir():
        from formats import write_cifar

        (out / "data").mkdir(parents=True, exist_ok=True)
        write_cifar(out / "data", n_train=10_000, n_test=2_000)
    # torchvision checks each file against the real CIFAR's md5: the wrapper points those checks at these files, then
    # runs `python train.py ARGS` in this process (nothing else differs from the command)
    wrapper = (
        "import hashlib, sys; from pathlib import Path; from torchvision import datasets; "
        "md5 = lambda p: hashlib.md5(p.read_bytes()).hexdigest(); c = datasets.CIFAR10; "
        "f = Path('data', c.base_folder); "
        "c.train_list = [[n, md5(f / n)] for n, _ in c.train_list]; c.test_list = [[n, md5(f / n)] for n, _ in "
        "c.test_list]; c.meta = {**c.meta, 'md5': md5(f / c.meta['filename'])}; "
        f"sys.path.insert(0, {str(ROOT)!r}); sys.argv = ['train.py', *sys.argv[1:]]; "
        "import train; train.main()"
    )
    command = [sys.executable, "-c", wrapper, "--trainer.max_steps", "3", "--trainer.enable_progress_bar", "false",
               *a.flags]  # fmt: skip
    start = time.perf_counter()
    marks, lines = {}, []
    proc = subprocess.Popen(command, cwd=out, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        now = round(time.perf_counter() - start, 1)
        lines.append(line.rstrip())
        for key, pattern in [("precision", r"^precision: "), ("loaded", r"^Seed set to"), ("estimate", r"^this recipe"),
                             ("fit_stopped", r"Trainer.fit. stopped"), ("exit", r"^chosen checkpoint|^test split")]:  # fmt: skip
            if re.search(pattern, line) and key not in marks:
                marks[key] = now
    proc.wait()
    marks["exit"] = round(time.perf_counter() - start, 1)
    steps = {}  # each step after fit ends its line with its seconds: "calibrated: ... [12.3 s]"
    for x in lines:
        if m := re.search(r"\[(\d+\.\d) s\]$", x):
            steps[x.split(":")[0][:40]] = float(m[1])
    row = {"flags": a.flags, "marks_s": marks, "after_fit_steps_s": steps, "returncode": proc.returncode,
           "precision": next((x for x in lines if x.startswith(("precision: ", "warning: precision"))), None),
           "estimate": next((x for x in lines if x.startswith("this recipe")), None)}  # fmt: skip
    print(json.dumps(row, indent=1))
    with open(out / "runs.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
