"""vit/evaluation/confusion_image.py: the confusion matrix PIL draws for TensorBoard and vit-eval's report."""

import matplotlib
import numpy as np
import torch

from vit.evaluation.confusion_image import confusion_image, pixels, png


def _cells_of(image, colour) -> int:
    return int((np.asarray(image) == np.array(colour, np.uint8)).all(-1).sum())


def test_each_cell_takes_the_colour_of_its_count_and_the_share_panel_of_its_row():
    cm = torch.tensor([[5, 0, 0], [0, 2, 2], [9, 0, 1]])  # the largest count at (2, 0); row 1 split half and half
    image = confusion_image(cm, ["cat", "dog", "bird"])
    blues = matplotlib.colormaps["Blues"]
    darkest = tuple(blues(1.0, bytes=True)[:3])
    cell = 48  # 3 classes: the largest cell
    # counts: only (2, 0) is at the maximum; shares: (0, 0) is 5/5 = 1.0 and (2, 0) is 9/10: one darkest cell each
    assert _cells_of(image, darkest) < 2 * cell * cell and _cells_of(image, darkest) > 1.5 * cell * cell
    assert _cells_of(image, tuple(blues(0.5, bytes=True)[:3])) > 1.5 * cell * cell  # shares 0.5 of row 1
    assert pixels(image).shape == (3, image.height, image.width) and pixels(image).dtype == torch.uint8
    assert png(image)[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_hundred_classes_stay_a_readable_size_with_every_name():
    image = confusion_image(torch.eye(100, dtype=torch.long) * 7, [f"class{i}" for i in range(100)])
    assert 2000 <= image.width <= 2800 and 1000 <= image.height <= 1400  # 10-px cells, names around them
    short = confusion_image(torch.eye(100, dtype=torch.long) * 7, [str(i) for i in range(100)])
    assert short.width < image.width  # the margins follow the longest name
