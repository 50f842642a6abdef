"""Batched augmentation against torchvision: each operation on the same images and parameters, and the drawn
operations and magnitudes against torchvision's own draws."""

from collections import Counter

import pytest
import torch
from torchvision.transforms import v2

import vit.data.augment as A


def apply_ops(x: torch.Tensor, op: torch.Tensor, mag: torch.Tensor, sort: bool | None = None) -> torch.Tensor:
    """One slot from operation ids and signed magnitudes, (B,) each: image b gets OPS[op[b]] with mag[b] (the
    entries -> apply_entries path BatchAutoAugment takes)."""
    table = A.entries(op.cpu(), mag.cpu(), x.shape[-2], x.shape[-1])
    table = A.Entries(*(t.to(x.device) for t in table))
    return A.apply_entries(x, table, torch.arange(len(op), device=x.device), sort)


def _images(B=6, C=3, H=32, W=32, seed=0) -> torch.Tensor:
    """Images with structure (gradients, a bright square, noise), so that every operation changes them."""
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.arange(H), torch.arange(W), indexing="ij")
    base = (xx * 255 / (W - 1)).expand(B, C, H, W).clone()
    base[:, :, H // 4 : H // 2, W // 4 : W // 2] = 230
    noise = torch.randint(-40, 40, (B, C, H, W), generator=g)
    scale = torch.linspace(0.3, 1.0, B)[:, None, None, None]
    return (base * scale + noise).clamp(0, 255).to(torch.uint8)


def torchvision_op(img: torch.Tensor, name: str, m: float) -> torch.Tensor:
    """torchvision's own implementation of one policy operation (the policy classes' dispatch)."""
    aug = v2.RandAugment()
    return aug._apply_image_or_video_transform(img, name, m, interpolation=v2.InterpolationMode.NEAREST, fill={})


CASES = [
    ("ShearX", [0.3, -0.3, 0.1]),
    ("ShearY", [0.99, -0.5, 0.2]),
    ("TranslateX", [13.6, -4.5, 32.0]),
    ("TranslateY", [-13.6, 7.0, 0.0]),
    ("Rotate", [30.0, -13.5, 90.0, 135.0]),
    ("Brightness", [0.9, -0.9, 0.3]),
    ("Color", [0.9, -0.6, 0.0]),
    ("Contrast", [0.99, -0.9, 0.45]),
    ("Sharpness", [0.9, -0.9, 0.3]),
    ("Posterize", [8.0, 4.0, 1.0, 0.0]),
    ("Solarize", [1.0, 0.5, 0.0, 0.73]),
    ("AutoContrast", [0.0]),
    ("Equalize", [0.0]),
    ("Invert", [0.0]),
    ("Identity", [0.0]),
]


@pytest.mark.parametrize("channels", [3, 1])
@pytest.mark.parametrize("name, mags", CASES)
def test_each_operation_matches_torchvision(name, mags, channels):
    x = _images(B=len(mags), C=channels)
    if name == "AutoContrast":
        x[0, 0] = 77  # a constant channel: left as it is
    op = torch.full((len(mags),), A.OP[name])
    ours = apply_ops(x, op, torch.tensor(mags))
    for b, m in enumerate(mags):
        ref = torchvision_op(x[b], name, m)
        diff = (ours[b].int() - ref.int()).abs()
        # float rounding can move a value across an integer boundary: at most one level, on a handful of pixels
        assert diff.max() <= 1 and (diff > 0).float().mean() < 0.01, (name, m, diff.max(), (diff > 0).sum())


def test_a_mixed_batch_gives_each_image_its_own_operation():
    x = _images(B=len(A.OPS))
    op = torch.arange(len(A.OPS))
    mag = torch.tensor([0.0, 0.2, -0.2, 5.0, -5.0, 20.0, 0.5, -0.5, 0.5, 0.5, 3.0, 0.5, 0.0, 0.0, 0.0])
    ours = apply_ops(x, op, mag)
    for b, name in enumerate(A.OPS):
        ref = torchvision_op(x[b], name, float(mag[b]))
        assert (ours[b].int() - ref.int()).abs().max() <= 1, name


def _record_torchvision_draws(transform, n: int, size=(32, 32)) -> Counter:
    seen = Counter()

    def record(image, transform_id, magnitude, interpolation, fill):
        seen[(transform_id, round(magnitude, 4))] += 1
        return image

    transform._apply_image_or_video_transform = record
    img = torch.zeros(3, *size, dtype=torch.uint8)
    torch.manual_seed(0)
    for _ in range(n):
        transform(img)
    return seen


def _our_draws(policy: str, n: int, size=(32, 32)) -> Counter:
    aug = A.BatchAutoAugment(policy)
    op, mag = aug.sample(n, *size, torch.Generator().manual_seed(1))
    seen = Counter()
    for o, m in zip(op.flatten().tolist(), mag.flatten().tolist()):
        seen[(A.OPS[o], round(m, 4))] += 1
    return seen


@pytest.mark.parametrize(
    "policy, transform",
    [
        ("randaugment", v2.RandAugment()),
        ("trivialaugment", v2.TrivialAugmentWide()),
        ("autoaugment_cifar10", v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10)),
        ("autoaugment_imagenet", v2.AutoAugment(v2.AutoAugmentPolicy.IMAGENET)),
    ],
)
def test_drawn_operations_and_magnitudes_follow_torchvision(policy, transform):
    n = 6000
    theirs = _record_torchvision_draws(transform, n)
    ours = _our_draws(policy, n)
    if policy.startswith("autoaugment"):  # torchvision skips an operation whose coin says no; we apply Identity
        ours.pop(("Identity", 0.0), None)
    p_t, p_o = sum(theirs.values()), sum(ours.values())
    unseen = sum(ours[k] for k in set(ours) - set(theirs)) / p_o  # rare outcomes may miss one finite sample
    assert unseen < 0.005, sorted(set(ours) - set(theirs))[:5]
    assert abs(p_o / p_t - 1) < 0.05  # as many operations applied per image

    def tv(a: Counter, b: Counter) -> float:
        na, nb = sum(a.values()), sum(b.values())
        return 0.5 * sum(abs(a[k] / na - b[k] / nb) for k in set(a) | set(b))

    def marginal(c: Counter, key) -> Counter:
        out = Counter()
        for k, v in c.items():
            out[key(k)] += v
        return out

    by_sign = lambda k: (k[0], k[1] > 0, k[1] < 0)  # noqa: E731
    # two samples of ~6,000-12,000 draws: ~0.02 apart when drawn alike
    assert tv(marginal(theirs, by_sign), marginal(ours, by_sign)) < 0.05
    if len(set(theirs)) <= 80:  # small spaces (RandAugment's fixed magnitude, AutoAugment's table): the joint law
        assert tv(theirs, ours) < 0.06
    else:  # TrivialAugment's 31 bins: per operation, the same spread of |magnitude|
        for name in {k[0] for k in theirs}:
            mt = torch.tensor([abs(k[1]) for k, v in theirs.items() if k[0] == name for _ in range(v)])
            mo = torch.tensor([abs(k[1]) for k, v in ours.items() if k[0] == name for _ in range(v)])
            q = torch.tensor([0.25, 0.5, 0.75])
            scale = max(mt.max().item(), 1e-6)
            assert torch.allclose(mt.quantile(q) / scale, mo.quantile(q) / scale, atol=0.08), name
    # the test can fail: never flipping the sign is far off
    flipped = Counter({(k[0], abs(k[1])): v for k, v in ours.items()})
    assert tv(marginal(theirs, by_sign), marginal(flipped, by_sign)) > 0.1


def test_a_batch_draws_per_image_not_per_batch():
    aug = A.BatchAutoAugment("trivialaugment")
    op, _ = aug.sample(256, 32, 32, torch.Generator().manual_seed(0))
    assert len(set(op.flatten().tolist())) >= 12  # nearly every operation appears in one batch


@pytest.mark.parametrize("policy", ["autoaugment_cifar10", "randaugment", "trivialaugment"])
def test_the_sorted_path_equals_the_masked_path(policy):
    """CPU runs each pass on its slice of the sorted batch, GPU on the whole batch with masks: the same function."""
    x = _images(B=64, seed=3)
    op, mag = A.BatchAutoAugment(policy).sample(64, 32, 32, torch.Generator().manual_seed(5))
    for s in range(op.shape[1]):
        a = apply_ops(x, op[:, s], mag[:, s], sort=True)
        b = apply_ops(x, op[:, s], mag[:, s], sort=False)
        assert torch.equal(a, b)
        x = a


def test_an_empty_stage_is_fine():
    x = _images(B=4)
    assert torch.equal(apply_ops(x, torch.zeros(4, dtype=torch.long), torch.zeros(4), sort=True), x)
