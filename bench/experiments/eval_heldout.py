"""For each (checkpoint, held-out folder, output folder): vit-eval, metrics.json recomputed from predictions.csv, and
every prediction compared with vit-predict's on the same files. One line per checkpoint (docs/evaluation.md).

    python bench/experiments/eval_heldout.py CKPT fmnist_png_heldout eval/s0 [CKPT2 DATA2 OUT2 ...]
"""

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vit.evaluation.report import metrics_of, read_predictions  # noqa: E402


def check(ckpt: str, data: str, out: str) -> str:
    subprocess.run([sys.executable, "-m", "vit.commands.eval", "--ckpt", ckpt, data, "--out", out], check=True)
    m = json.loads(Path(out, "metrics.json").read_text())
    paths, rows = read_predictions(Path(out, "predictions.csv"), m["classes"])
    again = json.loads(json.dumps(metrics_of(rows, m["classes"], m["temperature"])))
    recomputes = again == {k: v for k, v in m.items() if k != "skipped"}
    command = [sys.executable, "-m", "vit.commands.predict", "--ckpt", ckpt, "--format", "json", "--topk", "1", data]
    answers = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    answers = {r["path"]: r["predictions"][0] for r in answers}
    equal = sum(
        answers[p]["label"] == m["classes"][c] and answers[p]["prob"] == round(q, 6)
        for p, c, q in zip(paths, rows["pred"].tolist(), rows["prob"].tolist())
    )
    return (
        f"{ckpt}: n {m['n']} top1 {m['top1']:.4f} balanced {m['balanced_accuracy']:.4f} T {m['temperature']:.3f} "
        f"ECE {m['ece_uncalibrated']:.4f} -> {m['ece']:.4f} NLL {m['nll_uncalibrated']:.4f} -> {m['nll']:.4f} "
        f"recomputes {recomputes}, equal to vit-predict {equal} / {len(answers)}"
    )


if __name__ == "__main__":
    args = sys.argv[1:]
    for i in range(0, len(args), 3):
        print(check(*args[i : i + 3]))
