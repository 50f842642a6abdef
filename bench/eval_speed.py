"""vit-eval against vit-predict on the same labelled files, in one process, interleaved, median of rounds.

    python bench/data/to_folder.py ../shared/data/mnist10k.npz /tmp/m10k --val 0    # 10,000 28-px PNGs
    python bench/eval_speed.py --ckpt CKPT /tmp/m10k/train --rounds 3

vit-eval does all of predict's work (decode, forward) and then the metrics, three figures (the top losses with two
relevance maps each), predictions.csv and the page; the ratio is what that costs. Writes bench/eval_speed.json.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vit.commands.eval import main as eval_main  # noqa: E402
from vit.commands.predict import main as predict_main  # noqa: E402


def timed(fn) -> float:
    start = time.perf_counter()
    code = fn()
    assert code == 0, code
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("data", help="a labelled folder, <class>/<image>")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp())
    predict = lambda: predict_main(["--ckpt", args.ckpt, "--format", "csv", "--output", str(out / "p.csv"), args.data])  # noqa: E731
    evaluate = lambda: eval_main(["--ckpt", args.ckpt, args.data, "--out", str(out / "eval")])  # noqa: E731
    timed(predict)  # warm-up: page cache, imports, the first allocation of each size
    times = {"predict": [], "eval": []}
    for r in range(args.rounds):
        for name, fn in (
            (("predict", predict), ("eval", evaluate)) if r % 2 == 0 else (("eval", evaluate), ("predict", predict))
        ):
            times[name].append(timed(fn))
    n = json.loads((out / "eval" / "metrics.json").read_text())["n"]
    ratios = [e / p for e, p in zip(times["eval"], times["predict"])]
    result = {
        "images": n,
        "predict_s": times["predict"],
        "eval_s": times["eval"],
        "ratio_median": statistics.median(ratios),
        "ratios": ratios,
    }
    print(json.dumps(result, indent=1))
    Path(__file__).with_name("eval_speed.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
