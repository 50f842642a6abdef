"""The in-memory data path against the torchvision/PIL path's semantics."""

import pytest
import torch
import torch.nn.functional as F

from vit.data.crops import crop_flip, crop_flip_params
from vit.data.device import DeviceBatches
from vit.data.digits import DigitsDataModule
from vit.data.transforms import Augmentation, train_transform


def random_crop_flip(x: torch.Tensor, padding: int, hflip: bool, generator: torch.Generator) -> torch.Tensor:
    """torchvision's RandomCrop(size, padding) then RandomHorizontalFlip() on each image of a batch, from the two
    pieces DeviceBatches composes."""
    return crop_flip(x, *crop_flip_params(x.shape[0], padding, hflip, generator, x.device), padding)


MEAN, STD = (0.2, 0.3, 0.4), (0.5, 0.6, 0.7)
FLIP_CROP = Augmentation(crop_padding=2, hflip=True)


def _images(n=40, size=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, size, size), generator=g, dtype=torch.uint8), torch.arange(n) % 10


def _raw(x):
    """Back from normalised floats to uint8 values."""
    mean, std = torch.tensor(MEAN)[:, None, None], torch.tensor(STD)[:, None, None]
    return ((x * std + mean) * 255).round()


def _views(img, padding):
    """Every image RandomCrop(padding) + optional flip can produce from img, as (offset, flipped) -> tensor."""
    padded = F.pad(img.float(), (padding,) * 4)
    H, W = img.shape[-2:]
    out = {}
    for oy in range(2 * padding + 1):
        for ox in range(2 * padding + 1):
            crop = padded[:, oy : oy + H, ox : ox + W]
            out[(oy, ox, False)], out[(oy, ox, True)] = crop, crop.flip(-1)
    return out


def test_batches_have_the_right_shape_type_and_range():
    images, targets = _images()
    batches = list(DeviceBatches(images, targets, 16, MEAN, STD, train=True, augmentation=FLIP_CROP))
    assert len(batches) == 2  # drop_last on train: 40 -> 2 full batches
    for x, y in batches:
        assert x.shape == (16, 3, 8, 8) and x.dtype == torch.float32 and y.dtype == torch.long
        raw = _raw(x)
        assert raw.min() >= 0 and raw.max() <= 255


def test_crops_and_flips_are_real_and_follow_random_crop_semantics():
    images, _ = _images()
    ids = torch.arange(len(images))  # targets as ids: each output can be traced back to its source image
    offsets, flips = set(), set()
    for epoch in range(5):
        batches = DeviceBatches(images, ids, 8, MEAN, STD, train=True, augmentation=FLIP_CROP, seed=3)
        batches.set_epoch(epoch)
        for x, y in batches:
            for out, i in zip(_raw(x), y.tolist()):
                match = [k for k, v in _views(images[i], 2).items() if torch.equal(v, out)]
                assert match, "an output that no crop + flip of its source image can produce"
                offsets.add(match[0][:2])
                flips.add(match[0][2])
    assert flips == {True, False}
    assert len(offsets) >= 20  # of the 25 offsets of padding 2, nearly all drawn over 160 crops


def test_another_epoch_gives_other_batches_and_the_same_seed_the_same():
    images, targets = _images()
    a = DeviceBatches(images, targets, 8, MEAN, STD, train=True, augmentation=FLIP_CROP, seed=1)
    b = DeviceBatches(images, targets, 8, MEAN, STD, train=True, augmentation=FLIP_CROP, seed=1)
    first = [x for x, _ in a]
    assert all(torch.equal(x, y) for x, (y, _) in zip(first, b))
    a.set_epoch(1)
    assert not any(torch.equal(x, y) for x, (y, _) in zip(first, a))
    c = DeviceBatches(images, targets, 8, MEAN, STD, train=True, seed=2)
    assert [y.tolist() for _, y in c] != [y.tolist() for _, y in b]


def test_a_restored_epoch_continues_with_the_same_batches():
    """The epoch's augmentation is drawn at once: a loader restored mid-epoch gives exactly the batches it had left."""
    images, targets = _images(n=48, size=12)

    def loader():
        aug = Augmentation(
            crop_padding=2, hflip=True, auto_augment="autoaugment", autoaugment_policy="cifar10", erasing=0.5
        )
        return DeviceBatches(images, targets, 8, MEAN, STD, train=True, augmentation=aug, seed=4)

    a = loader()
    a.set_epoch(3)
    it = iter(a)
    seen = [next(it) for _ in range(2)]
    state = a.state_dict()
    rest = list(it)
    b = loader()
    b.load_state_dict(state)
    resumed = list(b)
    assert len(seen) + len(resumed) == len(a) == 6
    assert all(torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in zip(rest, resumed))


def test_validation_is_ordered_unaugmented_and_equals_the_pil_path():
    dm = DigitsDataModule(batch_size=50)
    xs, ys = zip(*DeviceBatches(*dm.memory["val"], 50, dm.mean, dm.std, train=False))
    x, y = torch.cat(xs), torch.cat(ys)
    assert len(x) == 360 and torch.equal(y, dm.val_set.targets)
    reference = torch.stack([dm.val_set[i][0] for i in range(360)])  # v2.ToDtype + v2.Normalize per image
    torch.testing.assert_close(x, reference, atol=1e-5, rtol=0)


def test_ranks_shard_like_distributed_sampler():
    images, targets = _images()
    one = DeviceBatches(images, targets, 8, MEAN, STD, train=True, seed=5)
    shards = [DeviceBatches(images, targets, 4, MEAN, STD, train=True, seed=5, rank=r, world_size=2) for r in (0, 1)]
    for (_, y), (_, y0), (_, y1) in zip(one, *shards):
        assert sorted(y.tolist()) == sorted(y0.tolist() + y1.tolist())


@pytest.mark.parametrize("hflip", [True, False])
def test_random_crop_flip_of_non_square_images_gives_their_padded_crops(hflip):
    x = torch.randint(1, 256, (48, 2, 5, 9), dtype=torch.uint8)  # no zeros: the padding is visible
    out = random_crop_flip(x, 3, hflip, torch.Generator().manual_seed(0))
    seen = set()
    for o, i in zip(out.float(), x):
        match = [k for k, v in _views(i, 3).items() if torch.equal(v, o) and (hflip or not k[2])]
        assert match, "an output that no crop (+ flip) of its source image can produce"
        seen.add(match[0])
    assert len({k[:2] for k in seen}) > 20 and len({k[2] for k in seen}) == 1 + hflip


def test_random_crop_flip_without_padding_only_flips():
    x = torch.randint(0, 256, (64, 3, 6, 7), dtype=torch.uint8)
    out = random_crop_flip(x, 0, True, torch.Generator().manual_seed(0))
    flipped = [torch.equal(o, i.flip(-1)) for o, i in zip(out, x)]
    assert all(f or torch.equal(o, i) for f, o, i in zip(flipped, out, x))
    assert 16 < sum(flipped) < 48
    assert torch.equal(random_crop_flip(x, 0, False, torch.Generator()), x)


def test_a_training_step_dispatches_as_many_operators_at_batch_8_as_at_64():
    """The hot path does not grow with the batch: no per-image Python anywhere between the uint8 images in memory and
    the optimizer update, with the CIFAR recipe's augmentation (crop, flip, AutoAugment, Random Erasing) and Mixup."""
    import numpy as np
    from torch.utils._python_dispatch import TorchDispatchMode

    from vit.training.module import ViTClassifier

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += 1
            return func(*args, **(kwargs or {}))

    def count(batch_size: int) -> int:
        torch.manual_seed(0)
        np.random.seed(0)  # timm's Mixup draws mixup-or-cutmix and lambda with numpy: the same path both times
        images = torch.randint(0, 256, (128, 3, 32, 32), dtype=torch.uint8)
        batches = DeviceBatches(
            images,
            torch.randint(0, 10, (128,)),
            batch_size,
            MEAN,
            STD,
            train=True,
            augmentation=Augmentation(
                crop_padding=4, hflip=True, auto_augment="autoaugment", autoaugment_policy="cifar10", erasing=0.25
            ),
        )
        module = ViTClassifier(arch=dict(embed_dim=32, depth=2, num_heads=2), mixup_alpha=0.8, cutmix_alpha=1.0)
        opt = torch.optim.AdamW(module.parameters(), fused=True)
        it = iter(batches)
        with Count() as c:
            x, y = next(it)
            loss = module.training_step((x, y), 0)
            loss.backward()
            opt.step()
        return c.n

    n8, n64 = count(8), count(64)
    assert n8 == n64 and n8 > 500, (n8, n64)


def test_quarter_turns_and_flips_give_each_image_one_of_its_eight_poses_all_of_them_drawn():
    images, targets = _images(n=64)
    targets = torch.arange(64)  # which image each output is
    seen = set()
    turns = Augmentation(hflip=True, rot90=True)
    batches = DeviceBatches(images, targets, 64, MEAN, STD, train=True, augmentation=turns, drop_last=False)
    for epoch in range(2):
        batches.set_epoch(epoch)
        for x, y in batches:
            for img, i in zip(_raw(x), y.tolist()):
                src = images[i].float()
                poses = [torch.rot90(p, k, (-2, -1)) for p in (src, src.flip(-1)) for k in range(4)]
                match = [j for j, p in enumerate(poses) if torch.equal(img, p)]
                assert match, f"image {i} is none of its 8 poses"
                seen.add(match[0])
    assert seen == set(range(8))


def test_the_torchvision_path_turns_the_same_way():
    img = torch.arange(3 * 6 * 6, dtype=torch.uint8).view(3, 6, 6)
    tf = train_transform(6, MEAN, STD, Augmentation(rot90=True))
    torch.manual_seed(0)
    outs = {tuple(_raw(tf(img)).flatten().tolist()) for _ in range(40)}
    assert outs == {tuple(torch.rot90(img.float(), k, (-2, -1)).flatten().tolist()) for k in range(4)}


def test_predict_normalises_to_the_same_floats_as_the_training_batches():
    """One uint8 -> normalised path (vit.data.transforms.normalize_uint8): vit-predict, vit-eval and vit-serve feed a
    checkpoint the floats its validation batches had, to the last bit; torchvision's per-item form agrees to
    rounding."""
    from vit.data.transforms import to_normalized
    from vit.deployment.predict import normalize

    images = torch.randint(0, 256, (8, 3, 16, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    mean, std = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
    x, _ = next(iter(DeviceBatches(images, torch.zeros(8, dtype=torch.long), 8, mean, std, train=False)))
    assert torch.equal(x, normalize(images, mean, std))
    assert torch.equal(normalize(images, torch.tensor(mean), torch.tensor(std)), x)  # channel_stats' tensors
    torch.testing.assert_close(x, to_normalized(mean, std)(images), rtol=0, atol=1e-5)
    given = images.float()
    normalize(given, mean, std)
    assert torch.equal(given, images.float())  # a float input is copied, not normalised in place


def test_one_augmentation_feeds_both_paths_and_an_unknown_policy_is_one_line():
    """A DataModule declares its augmentation once (vit.data.transforms.Augmentation): the per-image transforms and
    the batched loader draw from the same fields."""
    aug = Augmentation(hflip=True, rot90=True, rrc_scale=(0.5, 1.0), erasing=0.25)
    names = [type(t).__name__ for t in train_transform(8, MEAN, STD, aug).transforms]
    assert names[:2] == ["RandomResizedCrop", "RandomHorizontalFlip"] and "RandomQuarterTurn" in names
    assert names[-1] == "RandomErasing"
    batches = DeviceBatches(*_images(), 8, MEAN, STD, train=True, augmentation=aug)
    assert set(batches._draw(40)) == {"rrc", "crop", "turn", "erase"}
    assert set(DeviceBatches(*_images(), 8, MEAN, STD, train=True)._draw(40)) == set()  # the default: none
    assert aug.batch_policy is None and Augmentation(auto_augment="trivialaugment").batch_policy is not None
    with pytest.raises(ValueError, match="auto_augment='bogus' is not one of"):
        Augmentation(auto_augment="bogus")
