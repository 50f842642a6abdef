"""A screenshot of TensorBoard's own images dashboard showing a run's attention maps, as a user opens it
(`tensorboard --logdir logs`): TensorBoard serves LOGDIR, headless Chromium opens the images dashboard filtered to
TAGS, waits until the maps are drawn, and saves the page. docs/tensorboard_maps.png is made this way. The page test
(tests/evaluation/test_tensorboard_page.py) drives the same helpers (tests/browser.py).

    python bench/tensorboard_page.py logs/folder/version_0 docs/tensorboard_maps.png
"""

import argparse
import sys
import tempfile
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from browser import TB_ATTENTION_IMAGES, Browser, tensorboard  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("logdir")
    p.add_argument("out")
    p.add_argument("--tags", default="attention/(relevance|rollout)", help="TensorBoard's tag filter (a regex)")
    p.add_argument("--chromium", default="chromium")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp, tensorboard(Path(a.logdir)) as url, Browser(a.chromium, tmp) as page:
        page.open(f"{url}/#images&tagFilter={urllib.parse.quote(a.tags)}")
        shown = page.wait_for(TB_ATTENTION_IMAGES, timeout=120)
        page.screenshot(Path(a.out))
    print(f"{a.out}: {shown['drawn']} images drawn; tags {', '.join(shown['tags'])}")


if __name__ == "__main__":
    main()
