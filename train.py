"""Train a Vision Transformer: `python train.py` is the `vit-train` command (vit/commands/train.py).

python train.py                                        # CIFAR-10 with configs/cifar10.yaml
python train.py --config configs/digits.yaml           # offline demo, about a minute on a 2-core CPU (= make train)
python train.py --config configs/folder.yaml --data.root path/to/images
python train.py fit --config configs/digits.yaml --ckpt_path last   # resume the newest run of this config
python train.py --help
"""

import sys

from vit.commands.command_line import normalize_args  # noqa: F401  (tests call train.normalize_args)
from vit.commands.train import main, run  # noqa: F401  (tests and scripts call train.main(args))

if __name__ == "__main__":
    sys.exit(run())
