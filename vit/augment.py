"""Augmentation of a whole uint8 batch on its device, random per image, with torchvision's semantics.

torchvision's RandAugment / TrivialAugmentWide / AutoAugment draw one operation and magnitude per call, so they run
image by image; kornia's batched policies draw the operation once per batch (see shared FIELD-NOTES). Here every image
draws its own, as torchvision draws them (the policy tables are read from torchvision's classes), and the batch is
transformed with a fixed number of tensor operations, whatever its size and whatever was drawn:

- one "slot" of a policy gives each image exactly one operation (Identity when a sub-policy's coin says no);
- a slot runs three stages, each leaving the images whose operation is not its own unchanged: geometry (ShearX/Y,
  TranslateX/Y, Rotate) as one affine grid_sample with a matrix per image; pointwise operations (Posterize, Solarize,
  Invert, AutoContrast, Equalize, Brightness, Contrast) as one gather from a 256-entry lookup table per image and
  channel; blends (Color, Sharpness) as one blend with a degenerate image and factor per image.
- on GPU each stage runs on the whole batch with masks: no data-dependent shapes, no host reads, nothing waits for
  the device; on CPU each stage runs on its own images only (see apply_ops).

Each operation is tested against torchvision's functional on the same image and parameters, and the drawn operations
and magnitudes against torchvision's own draws (tests/test_augment.py).

    aug = BatchAutoAugment("autoaugment_cifar10")
    x = aug(x_uint8, generator)                       # (B, C, H, W) uint8 -> uint8
    x = random_resized_crop(x_uint8, 32, generator)   # per-image crop boxes, bilinear
    x = random_erasing(x_float, 0.25, generator)      # after Normalize, value 0
"""

import functools
import math

import torch
import torch.nn.functional as F
from torchvision.transforms import v2

OPS = (
    "Identity",
    "ShearX",
    "ShearY",
    "TranslateX",
    "TranslateY",
    "Rotate",
    "Brightness",
    "Color",
    "Contrast",
    "Sharpness",
    "Posterize",
    "Solarize",
    "AutoContrast",
    "Equalize",
    "Invert",
)
OP = {name: i for i, name in enumerate(OPS)}
GEOMETRIC = [OP[n] for n in ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")]
POINTWISE = [OP[n] for n in ("Posterize", "Solarize", "AutoContrast", "Equalize", "Invert")]
POINTWISE_ALL = POINTWISE + [OP["Brightness"], OP["Contrast"]]  # as lookup tables (pointwise())
BLENDS = [OP[n] for n in ("Color", "Sharpness")]
POLICIES = ("randaugment", "trivialaugment", "autoaugment_imagenet", "autoaugment_cifar10", "autoaugment_svhn")


def _isin(op: torch.Tensor, ids: list[int]) -> torch.Tensor:
    return torch.isin(op, torch.tensor(ids, device=op.device))


def _inverse_affine(angle, tx, ty, shear_x, shear_y, cx, cy) -> torch.Tensor:
    """torchvision's `_get_inverse_affine_matrix` (scale 1) for a batch of parameters, in float64 as torchvision
    computes it in Python floats: (B,) each, degrees and pixels -> (B, 2, 3)."""
    rot, sx, sy = torch.deg2rad(angle), torch.deg2rad(shear_x), torch.deg2rad(shear_y)
    a = torch.cos(rot - sy) / torch.cos(sy)
    b = -(a * torch.tan(sx) + torch.sin(rot))
    c = torch.sin(rot - sy) / torch.cos(sy)
    d = torch.cos(rot) - c * torch.tan(sx)
    m0, m1, m3, m4 = d, -b, -c, a
    m2 = cx - m0 * (cx + tx) - m1 * (cy + ty)
    m5 = cy - m3 * (cx + tx) - m4 * (cy + ty)
    return torch.stack([m0, m1, m2, m3, m4, m5], dim=-1).view(-1, 2, 3)


@functools.lru_cache(maxsize=16)
def _base_grid(H: int, W: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """torchvision's _affine_grid base: pixel centres relative to the image centre, (1, H*W, 3), and half the size by
    which the transformed grid is normalised."""
    xs = torch.linspace((1.0 - W) * 0.5, (W - 1.0) * 0.5, W, device=device)
    ys = torch.linspace((1.0 - H) * 0.5, (H - 1.0) * 0.5, H, device=device)
    base = torch.stack([xs.expand(H, W), ys[:, None].expand(H, W), torch.ones(H, W, device=device)], dim=-1)
    return base.view(1, H * W, 3), torch.tensor([0.5 * W, 0.5 * H], device=device)


def geometric(x: torch.Tensor, op: torch.Tensor, mag: torch.Tensor) -> torch.Tensor:
    """ShearX/Y, TranslateX/Y and Rotate of torchvision's policies (nearest, fill 0), each image its own operation
    and magnitude; other images unchanged. x (B, C, H, W) uint8; op (B,) ids of OPS; mag (B,) float."""
    B, C, H, W = x.shape
    m = mag.double()
    zero = torch.zeros_like(m)
    is_op = {n: op == OP[n] for n in ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")}
    shear_deg = torch.rad2deg(torch.atan(m))
    # ShearX/Y use center=[0, 0] (the top-left corner), which torchvision turns into (-W/2, -H/2) from the centre.
    corner = is_op["ShearX"] | is_op["ShearY"]
    theta = _inverse_affine(
        angle=torch.where(is_op["Rotate"], -m, zero),  # rotate_image passes -angle to the matrix
        tx=torch.where(is_op["TranslateX"], torch.trunc(m), zero),  # int(magnitude)
        ty=torch.where(is_op["TranslateY"], torch.trunc(m), zero),
        shear_x=torch.where(is_op["ShearX"], shear_deg, zero),
        shear_y=torch.where(is_op["ShearY"], shear_deg, zero),
        cx=torch.where(corner, torch.full_like(m, -W * 0.5), zero),
        cy=torch.where(corner, torch.full_like(m, -H * 0.5), zero),
    ).float()
    base, scale = _base_grid(H, W, x.device)
    grid = base.expand(B, -1, -1).bmm(theta.transpose(1, 2) / scale).view(B, H, W, 2)
    out = F.grid_sample(x.float(), grid, mode="nearest", padding_mode="zeros", align_corners=False)
    out = out.round_().to(torch.uint8)
    return torch.where(_isin(op, GEOMETRIC)[:, None, None, None], out, x)  # identity's grid is exact; cheap anyway


def _gray(xf: torch.Tensor) -> torch.Tensor:
    """torchvision's grayscale of a float batch with uint8 values, floored: (B, C, H, W) -> (B, 1, H, W)."""
    if xf.shape[1] == 1:
        return xf
    return (xf[:, 0] * 0.2989 + xf[:, 1] * 0.587 + xf[:, 2] * 0.114).floor_()[:, None]


POINTWISE_NAMES = ("Posterize", "Solarize", "AutoContrast", "Equalize", "Invert", "Brightness", "Contrast")


def pointwise(
    x: torch.Tensor,
    op: torch.Tensor,
    mag: torch.Tensor,
    gray: torch.Tensor | None = None,
    kinds: tuple[str, ...] = POINTWISE_NAMES,
) -> torch.Tensor:
    """Posterize, Solarize, AutoContrast, Equalize, Invert, Brightness and Contrast: each a function of the pixel value
    given the image (Contrast: given its mean gray), so one lookup table per image and channel, (B, C, 256), built
    with torchvision's float formulas on the 256 values, then one gather over the pixels; other images unchanged.
    `kinds`: the operations whose tables to build (the CPU path calls it for Equalize apart: only it needs a
    histogram)."""
    B, C, H, W = x.shape
    dev = x.device
    v = torch.arange(256, device=dev)
    vf = v.float()
    m = mag[:, None, None]  # (B, 1, 1)
    # Posterize: keep the top `bits` bits (8 bits: unchanged)
    bits = mag.trunc().long().clamp(0, 8)[:, None, None]
    lut_post = v & (((1 << bits) - 1) << (8 - bits))
    # Solarize: invert the values >= threshold (255 * magnitude)
    lut_sol = torch.where(vf >= 255.0 * m, 255 - v, v)
    lut_auto = vf
    if "AutoContrast" in kinds:
        # AutoContrast: per channel, (v - min) / ((max - min) / 255), unchanged where max == min
        lo = x.amin(dim=(-2, -1)).float()[..., None]  # (B, C, 1)
        hi = x.amax(dim=(-2, -1)).float()[..., None]
        flat_chan = lo == hi
        inv_scale = torch.where(flat_chan, torch.ones_like(hi), (hi - lo) * (1.0 / 255))
        lo = torch.where(flat_chan, torch.zeros_like(lo), lo)
        lut_auto = ((vf - lo) / inv_scale).clamp_(0, 255)
    values = x.view(B, C, H * W).long()  # gather and scatter want int64 indices: converted once, used twice
    lut_eq = v
    if "Equalize" in kinds:  # PIL's scheme as torchvision implements it
        hist = torch.zeros(B, C, 256, dtype=torch.int32, device=dev)
        hist.scatter_add_(-1, values, torch.ones(1, dtype=torch.int32, device=dev).expand_as(values))
        cum = hist.cumsum(-1)
        last = hist.gather(-1, cum.argmax(-1, keepdim=True))  # count of the largest value present
        step = torch.div(H * W - last, 255, rounding_mode="floor")  # (B, C, 1)
        lut_eq = torch.div(cum[..., :-1] + step // 2, step.clamp(min=1), rounding_mode="floor").clamp(0, 255)
        lut_eq = torch.cat([torch.zeros_like(lut_eq[..., :1]), lut_eq], dim=-1)
        lut_eq = torch.where(step != 0, lut_eq, v)  # a nearly constant channel stays as it is
    # Brightness: v * factor; Contrast: v * factor + (1 - factor) * mean gray (torchvision's _blend, per pixel)
    lut_bright = (vf * (1.0 + m)).clamp_(0, 255)
    lut_contrast = vf
    if "Contrast" in kinds:
        mean = (gray if gray is not None else _gray(x.float())).mean(dim=(-3, -2, -1))[:, None, None]  # (B, 1, 1)
        lut_contrast = (vf * (1.0 + m) + (-m) * mean).clamp_(0, 255)
    everything = {
        "Posterize": lut_post,
        "Solarize": lut_sol,
        "AutoContrast": lut_auto,
        "Equalize": lut_eq,
        "Invert": 255 - v,
        "Brightness": lut_bright,
        "Contrast": lut_contrast,
    }
    names = ("Identity", *kinds)
    tables = [v, *(everything[k] for k in kinds)]
    # uint8 tables (truncating as torchvision's .to(uint8)), stacked: (K, B, C, 256); each image takes its own row
    tables = torch.stack([t.to(torch.uint8).expand(B, C, 256) for t in tables])
    row = torch.zeros(B, dtype=torch.long, device=dev)
    for k, name in enumerate(names[1:], start=1):
        row = torch.where(op == OP[name], k, row)
    lut = tables.gather(0, row.view(1, B, 1, 1).expand(1, B, C, 256))[0]  # (B, C, 256)
    # gather along the value axis: 4x faster on CPU than indexing a flattened table with offsets (measured)
    return lut.gather(-1, values).view(B, C, H, W)


def blend(x: torch.Tensor, op: torch.Tensor, mag: torch.Tensor, gray: torch.Tensor | None = None) -> torch.Tensor:
    """Color (saturation) and Sharpness with factor 1 + magnitude, torchvision's formulas: a blend with a degenerate
    image (the grayscale; the blurred interior); other images unchanged.

    Chosen per image by coefficients rather than by selecting among blended batches: other images get factor 1 and
    weight 0 on the degenerate (exactly x)."""
    B, C, H, W = x.shape
    is_color = (op == OP["Color"])[:, None, None, None] & (C == 3)  # one channel: Color leaves it (as PIL does)
    is_sharp = (op == OP["Sharpness"])[:, None, None, None]
    m = mag[:, None, None, None]
    alpha = torch.where(is_color | is_sharp, -m, torch.zeros_like(m))  # torchvision's 1 - factor, exact
    xf = x.float()
    gray = gray if gray is not None else _gray(xf)
    # Sharpness' degenerate: the 3x3 kernel [[1,1,1],[1,5,1],[1,1,1]] / 13 on the interior, rounded; the border kept.
    # As sums of shifted views: a depthwise conv2d took 13 of this function's 22 ms (256 CIFAR images, 2-core CPU).
    sharp = xf.clone()
    if H > 2 and W > 2:
        rows = xf[..., :-2, :] + xf[..., 1:-1, :] + xf[..., 2:, :]  # (B, C, H-2, W)
        box = rows[..., :-2] + rows[..., 1:-1] + rows[..., 2:]  # (B, C, H-2, W-2)
        sharp[..., 1:-1, 1:-1] = ((box + 4 * xf[..., 1:-1, 1:-1]) / 13.0).round_()
    # torchvision: sharpness as x + (1 - r) (blurred - x); saturation as x r + (1 - r) gray
    out = torch.where(is_sharp, xf + alpha * (sharp - xf), xf * (1.0 - alpha) + alpha * gray)
    return out.clamp_(0, 255).to(torch.uint8)


def apply_ops(x: torch.Tensor, op: torch.Tensor, mag: torch.Tensor, subset: bool | None = None) -> torch.Tensor:
    """One slot: image b gets OPS[op[b]] with magnitude mag[b]. x (B, C, H, W) uint8.

    Each stage changes only the images whose operation is its own, so it can run on the whole batch (masks: no
    data-dependent shapes, nothing waits for the device: the default on GPU) or on just those images (`subset`: the
    default on CPU, where there is no device to wait for and every pass over a skipped image is time lost: 2.2x faster
    than the masks for the CIFAR AutoAugment policy on 2 cores). Both give the same result (tested). The number of
    operators dispatched is the same for any batch size either way."""
    if subset is None:
        subset = x.device.type == "cpu"
    if subset:
        x = x.clone()  # then written in place, stage by stage
    stages = ((GEOMETRIC, geometric), (POINTWISE_ALL, pointwise), (BLENDS, blend))
    if subset:  # Equalize apart: the only operation that needs a histogram
        others = tuple(n for n in POINTWISE_NAMES if n != "Equalize")
        stages = (
            (GEOMETRIC, geometric),
            ([OP["Equalize"]], functools.partial(pointwise, kinds=("Equalize",))),
            ([OP[n] for n in others], functools.partial(pointwise, kinds=others)),
            (BLENDS, blend),
        )
    for ids, stage in stages:
        if subset:
            idx = _isin(op, ids).nonzero().squeeze(1)
            x.index_copy_(0, idx, stage(x.index_select(0, idx), op[idx], mag[idx]))
        else:
            x = stage(x, op, mag)
    return x


class BatchAutoAugment:
    """torchvision's RandAugment (num_ops 2, magnitude 9 of 31), TrivialAugmentWide (31 bins) or AutoAugment
    (ImageNet, CIFAR10, SVHN policies) on a uint8 batch, every image drawing its own operations and magnitudes.

    Args:
        policy: one of POLICIES.
    """

    def __init__(self, policy: str, num_ops: int = 2, magnitude: int = 9, num_magnitude_bins: int = 31):
        if policy not in POLICIES:
            raise ValueError(f"auto_augment={policy!r} is not one of {list(POLICIES)}")
        self.policy, self.num_ops, self.magnitude, self.bins = policy, num_ops, magnitude, num_magnitude_bins
        self._tables: dict = {}

    def _space(self):
        return (v2.RandAugment if self.policy == "randaugment" else v2.TrivialAugmentWide)._AUGMENTATION_SPACE

    def _table(self, H: int, W: int, device) -> dict:
        """Per (H, W): the policy's op ids, magnitude tables and sign flags as tensors on the device."""
        key = (H, W, str(device))
        if key in self._tables:
            return self._tables[key]
        if self.policy.startswith("autoaugment"):
            name = {"imagenet": "IMAGENET", "cifar10": "CIFAR10", "svhn": "SVHN"}[self.policy.split("_")[1]]
            pols = v2.AutoAugment(getattr(v2.AutoAugmentPolicy, name))._policies
            space = v2.AutoAugment._AUGMENTATION_SPACE
            ops, probs, mags, signed = [], [], [], []
            for sub in pols:
                for transform_id, p, idx in sub:
                    fn, sgn = space[transform_id]
                    table = fn(10, H, W)
                    ops.append(OP[transform_id])
                    probs.append(p)
                    mags.append(float(table[idx]) if table is not None else 0.0)
                    signed.append(sgn and table is not None)
            shape = (len(pols), 2)
            t = {
                "op": torch.tensor(ops, device=device).view(shape),
                "p": torch.tensor(probs, device=device).view(shape),
                "mag": torch.tensor(mags, device=device).view(shape),
                "signed": torch.tensor(signed, device=device).view(shape),
            }
        else:
            space = self._space()
            names = list(space)
            mags = torch.zeros(len(names), self.bins)
            signed = []
            for i, n in enumerate(names):
                fn, sgn = space[n]
                table = fn(self.bins, H, W)
                if table is not None:
                    mags[i] = table.float()
                signed.append(sgn and table is not None)
            t = {
                "op": torch.tensor([OP[n] for n in names], device=device),
                "mag": mags.to(device),
                "signed": torch.tensor(signed, device=device),
            }
        self._tables[key] = t
        return t

    def sample(
        self, B: int, H: int, W: int, generator: torch.Generator, device=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each image's operations and signed magnitudes, as torchvision draws them: (B, slots) ids and floats."""
        device = device or generator.device
        t = self._table(H, W, device)

        def rand(*shape):
            return torch.rand(*shape, generator=generator, device=generator.device).to(device)

        def randint(n, *shape):
            return torch.randint(n, shape, generator=generator, device=generator.device).to(device)

        if self.policy.startswith("autoaugment"):
            sub = randint(t["op"].shape[0], B)  # one sub-policy per image
            op, p, mag, sgn = t["op"][sub], t["p"][sub], t["mag"][sub], t["signed"][sub]  # (B, 2)
            coin = rand(B, 2) <= p
            op, mag = torch.where(coin, op, torch.zeros_like(op)), torch.where(coin, mag, torch.zeros_like(mag))
        elif self.policy == "randaugment":
            k = randint(len(t["op"]), B, self.num_ops)
            op, mag, sgn = t["op"][k], t["mag"][k, self.magnitude], t["signed"][k]
        else:  # trivialaugment: one operation, a uniformly drawn magnitude bin
            k, bin_ = randint(len(t["op"]), B, 1), randint(self.bins, B, 1)
            op, mag, sgn = t["op"][k], t["mag"][k, bin_], t["signed"][k]
        mag = torch.where(sgn & (rand(*op.shape) <= 0.5), -mag, mag)
        return op, mag

    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        op, mag = self.sample(x.shape[0], x.shape[-2], x.shape[-1], generator, x.device)
        for s in range(op.shape[1]):
            x = apply_ops(x, op[:, s], mag[:, s])
        return x


def random_resized_crop_boxes(
    B: int, H: int, W: int, generator: torch.Generator, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), device=None
) -> torch.Tensor:
    """torchvision's RandomResizedCrop.get_params for B images at once: 10 tries each, the first that fits, else the
    central crop of the clamped ratio. Returns (B, 4) float: top, left, height, width."""
    device = device or generator.device
    area = H * W
    tries = 10
    u = torch.rand(B, tries, 2, generator=generator, device=generator.device).to(device)
    target = area * (scale[0] + u[..., 0] * (scale[1] - scale[0]))
    log_r = math.log(ratio[0]) + u[..., 1] * (math.log(ratio[1]) - math.log(ratio[0]))
    aspect = torch.exp(log_r)
    w = torch.round(torch.sqrt(target * aspect))
    h = torch.round(torch.sqrt(target / aspect))
    ok = (w > 0) & (h > 0) & (w <= W) & (h <= H)
    first = torch.where(ok.any(1), ok.float().argmax(1), torch.zeros(B, dtype=torch.long, device=device))
    w, h = w.gather(1, first[:, None])[:, 0], h.gather(1, first[:, None])[:, 0]
    v = torch.rand(B, 2, generator=generator, device=generator.device).to(device)
    top = torch.floor(v[:, 0] * (H - h + 1))  # torch.randint(0, H - h + 1)
    left = torch.floor(v[:, 1] * (W - w + 1))
    # fallback: the whole image at the ratio clamped into range, centred
    in_ratio = W / H
    if in_ratio < min(ratio):
        fw, fh = W, int(round(W / min(ratio)))
    elif in_ratio > max(ratio):
        fw, fh = int(round(H * max(ratio))), H
    else:
        fw, fh = W, H
    fb = torch.tensor([(H - fh) // 2, (W - fw) // 2, fh, fw], dtype=torch.float32, device=device)
    boxes = torch.stack([top, left, h, w], dim=1)
    return torch.where(ok.any(1)[:, None], boxes, fb)


def resized_crop(x: torch.Tensor, boxes: torch.Tensor, size: int) -> torch.Tensor:
    """Crop each image to its box and resize to size x size, bilinear as F.interpolate (align_corners False, source
    coordinates clamped inside the crop). x (B, C, H, W) uint8, boxes (B, 4) top, left, h, w -> (B, C, size, size)."""
    B, C, H, W = x.shape
    top, left, h, w = boxes.unbind(1)
    j = torch.arange(size, device=x.device, dtype=torch.float32) + 0.5
    # source pixel coordinate in the crop, clamped to its first and last pixel, then moved into the image
    sx = (j[None] * (w[:, None] / size) - 0.5).clamp(min=0).minimum(w[:, None] - 1) + left[:, None]
    sy = (j[None] * (h[:, None] / size) - 0.5).clamp(min=0).minimum(h[:, None] - 1) + top[:, None]
    gx = (2 * sx + 1) / W - 1  # align_corners=False normalisation of pixel coordinates
    gy = (2 * sy + 1) / H - 1
    grid = torch.stack([gx[:, None, :].expand(B, size, size), gy[:, :, None].expand(B, size, size)], dim=-1)
    out = F.grid_sample(x.float(), grid, mode="bilinear", padding_mode="border", align_corners=False)
    return out.round_().clamp_(0, 255).to(torch.uint8)


def random_resized_crop(
    x: torch.Tensor, size: int, generator: torch.Generator, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)
) -> torch.Tensor:
    """RandomResizedCrop of each image of a uint8 batch, its own box: (B, C, H, W) -> (B, C, size, size)."""
    boxes = random_resized_crop_boxes(x.shape[0], x.shape[-2], x.shape[-1], generator, scale, ratio, x.device)
    return resized_crop(x, boxes, size)


def random_erasing_boxes(
    B: int, H: int, W: int, p: float, generator: torch.Generator, scale=(0.02, 0.33), ratio=(0.3, 3.3), device=None
) -> torch.Tensor:
    """torchvision's RandomErasing.get_params for B images: with probability p a rectangle (10 tries for one that
    fits, strictly smaller than the image), else none. Returns (B, 4) float top, left, h, w (h = 0: no erasing)."""
    device = device or generator.device
    tries = 10
    u = torch.rand(B, tries, 4, generator=generator, device=generator.device).to(device)
    target = H * W * (scale[0] + u[..., 0] * (scale[1] - scale[0]))
    log_r = math.log(ratio[0]) + u[..., 1] * (math.log(ratio[1]) - math.log(ratio[0]))
    aspect = torch.exp(log_r)
    h = torch.round(torch.sqrt(target * aspect))
    w = torch.round(torch.sqrt(target / aspect))
    ok = (h < H) & (w < W)
    first = ok.float().argmax(1, keepdim=True)
    h, w = h.gather(1, first)[:, 0], w.gather(1, first)[:, 0]
    top = torch.floor(u.gather(1, first[..., None].expand(B, 1, 4))[:, 0, 2] * (H - h + 1))
    left = torch.floor(u.gather(1, first[..., None].expand(B, 1, 4))[:, 0, 3] * (W - w + 1))
    coin = torch.rand(B, generator=generator, device=generator.device).to(device) < p
    keep = (coin & ok.any(1)).float()
    return torch.stack([top, left, h * keep, w * keep], dim=1)


def erase(x: torch.Tensor, boxes: torch.Tensor, value: float = 0.0, inplace: bool = False) -> torch.Tensor:
    """Set each image's box to `value`: x (B, C, H, W), boxes (B, 4) top, left, h, w (h = 0: untouched)."""
    H, W = x.shape[-2:]
    top, left, h, w = (b[:, None] for b in boxes.unbind(1))
    rows = torch.arange(H, device=x.device)[None]
    cols = torch.arange(W, device=x.device)[None]
    in_r = (rows >= top) & (rows < top + h)  # (B, H)
    in_c = (cols >= left) & (cols < left + w)  # (B, W)
    mask = in_r[:, None, :, None] & in_c[:, None, None, :]
    return x.masked_fill_(mask, value) if inplace else x.masked_fill(mask, value)


def random_erasing(
    x: torch.Tensor, p: float, generator: torch.Generator, value: float = 0.0, inplace: bool = False
) -> torch.Tensor:
    """RandomErasing of each image of a batch with probability p (after Normalize: value 0 is the mean colour). On CPU
    only the erased images are touched (as in apply_ops); `inplace` writes them into x instead of a copy of the whole
    batch (the in-memory path passes its fresh batch: 3 MB less to copy per 256 CIFAR images)."""
    boxes = random_erasing_boxes(x.shape[0], x.shape[-2], x.shape[-1], p, generator, device=x.device)
    if x.device.type != "cpu":
        return erase(x, boxes, value, inplace=inplace)
    idx = (boxes[:, 2] > 0).nonzero().squeeze(1)
    erased = erase(x.index_select(0, idx), boxes[idx], value)
    return x.index_copy_(0, idx, erased) if inplace else x.index_copy(0, idx, erased)
