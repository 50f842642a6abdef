"""Classify image files with a checkpoint: `python predict.py --ckpt PATH [options] INPUT...` (see --help).

The same command is installed as `vit-predict`.
"""

import sys

from vit.commands.predict import main

if __name__ == "__main__":
    sys.exit(main())
