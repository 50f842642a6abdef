"""`python train.py --budget B` on full-size CIFAR-10-format files, timed from the process's start to its exit.

    python bench/experiments/cifar_budget.py write /tmp/cifar_full            # 50,000 / 10,000 random images, CIFAR-10's layout
    cd /tmp/cifar_full && python /path/to/bench/experiments/cifar_budget.py train . --budget 3min [more train.py flags]

No CIFAR here: the images are random (the accuracy means nothing; the plan, the speed and the wall time do), and
torchvision's checksums are pointed at these files, as tests/formats.py does. `train` runs `train.main` in this
process, so the budget counts its imports, as `python train.py` would; it prints the wall time at exit.
"""

import hashlib
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[2] / "tests")]


def trust(root: Path) -> None:
    from torchvision import datasets

    cls = datasets.CIFAR10
    md5 = {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in (root / cls.base_folder).iterdir()}
    cls.train_list = [[n, md5[n]] for n, _ in cls.train_list]
    cls.test_list = [[n, md5[n]] for n, _ in cls.test_list]
    cls.meta = {**cls.meta, "md5": md5[cls.meta["filename"]]}
    cls._check_integrity = lambda self: True  # the archive's checksum is not needed once unpacked


def main() -> None:
    what, root, *flags = sys.argv[1:]
    if what == "write":
        from formats import write_cifar

        write_cifar(Path(root) / "data", n_train=50_000, n_test=10_000)
        return
    import train

    trust(Path(root) / "data")
    try:
        train.main(["fit", "--config", "configs/cifar10.yaml", *flags])
    finally:
        from vit.planning.budget import process_start

        print(f"wall from process start: {time.time() - process_start():.1f} s", flush=True)


if __name__ == "__main__":
    main()
