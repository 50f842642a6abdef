"""The built-in offline `digits` set: scikit-learn's 1,797 real 8x8 handwritten digits, shipped in the package."""

import torch
import torch.nn.functional as F

from vit.data.base import ImageClassificationData, TensorImageDataset, channel_mean_std
from vit.data.transforms import Augmentation, to_normalized, train_transform


class DigitsDataModule(ImageClassificationData):
    """scikit-learn's 1,797 real 8x8 handwritten digits (shipped inside the package: works offline), upscaled to
    img_size x img_size RGB. A fixed train/val split by `split_seed`; random-crop augmentation, no flip (a flipped
    digit is another glyph). `in_memory` (default) batches and augments on the training device (vit.data.device);
    off, a DataLoader with per-image torchvision transforms does the same."""

    def __init__(
        self,
        img_size: int = 32,
        val_size: int = 360,
        split_seed: int = 0,
        batch_size: int = 64,
        num_workers: int = 0,
        crop_padding: int = 4,
        in_memory: bool = True,
        eval_batch_size: int | None = None,
    ):
        super().__init__(batch_size, num_workers, in_memory, eval_batch_size)
        from sklearn.datasets import load_digits

        digits = load_digits()
        if not 0 < val_size < len(digits.target):
            raise ValueError(f"val_size={val_size} must be between 1 and {len(digits.target) - 1}")
        x = torch.from_numpy(digits.images).float()[:, None] / 16.0  # (N, 1, 8, 8) in [0, 1]
        x = F.interpolate(x, size=(img_size, img_size), mode="bilinear", align_corners=False)
        images = (x.clamp(0, 1) * 255).round().to(torch.uint8).expand(-1, 3, -1, -1).contiguous()  # (N, 3, S, S)
        targets = torch.from_numpy(digits.target).long()
        perm = torch.randperm(len(targets), generator=torch.Generator().manual_seed(split_seed))
        train_idx, val_idx = perm[val_size:], perm[:val_size]

        self.num_classes, self.class_names = 10, [str(i) for i in range(10)]
        self.img_size, self.in_chans = img_size, 3
        mean, std = channel_mean_std(images[train_idx])
        self.mean, self.std = tuple(round(v, 4) for v in mean.tolist()), tuple(round(v, 4) for v in std.tolist())
        self.augmentation = Augmentation(crop_padding=crop_padding)  # no flips: digits are not mirror-symmetric
        self.train_set = TensorImageDataset(
            images[train_idx],
            targets[train_idx],
            train_transform(img_size, self.mean, self.std, self.augmentation),
        )
        self.val_set = TensorImageDataset(
            images[val_idx],
            targets[val_idx],
            to_normalized(self.mean, self.std),
        )
        self.memory = {"train": (images[train_idx], targets[train_idx]), "val": (images[val_idx], targets[val_idx])}
