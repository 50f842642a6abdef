"""Augmentation of a whole uint8 batch on its device, random per image, with torchvision's semantics.

torchvision's RandAugment / TrivialAugmentWide / AutoAugment draw one operation and magnitude per call, so they run
image by image; kornia's batched policies draw the operation once per batch (see shared FIELD-NOTES). Here every image
draws its own, as torchvision draws them (the policy tables are read from torchvision's classes), and the batch is
transformed with a fixed number of tensor operations, whatever its size and whatever was drawn:

- a policy is a finite table of "entries" (operation, signed magnitude), built once per image size with everything
  an entry needs precomputed: its affine grid matrix (ShearX/Y, TranslateX/Y, Rotate), its 256-value lookup table
  (Posterize, Solarize, Invert, Brightness) or its blend factor (Contrast, Color, Sharpness); AutoContrast and
  Equalize depend on the image and are computed from it. Drawing an operation is drawing an entry index.
- one "slot" of a policy gives each image exactly one entry (Identity when a sub-policy's coin says no); the images
  of each kind of operation (KINDS) go through one kernel: one grid_sample, one gather from lookup tables, one
  histogram, one blend.
- on GPU every kernel runs on the whole batch and a mask picks each image's result: no data-dependent shapes, no
  host reads. On CPU the batch is sorted by kind and each kernel runs on its own slice (see apply_entries).

Each operation is tested against torchvision's functional on the same image and parameters, and the drawn operations
and magnitudes against torchvision's own draws (tests/data_pipeline/test_augment.py).

    aug = BatchAutoAugment("autoaugment_cifar10")
    x = aug(x_uint8, generator)                       # (B, C, H, W) uint8 -> uint8
    entry = aug.draw(B, H, W, generator)              # or: draw (e.g. a whole epoch at once), then apply
    x = aug.apply(x_uint8, entry)

Crops, flips and Random Erasing, batched the same way: vit/data/crops.py.
"""

from typing import NamedTuple

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
# How each operation is computed: one kernel per kind (below), each image's parameters from its entry.
KINDS = ("Identity", "Geometric", "Lookup", "AutoContrast", "Equalize", "Contrast", "Color", "Sharpness")
KIND_OF = {
    **dict.fromkeys(("Identity",), 0),
    **dict.fromkeys(("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"), 1),
    **dict.fromkeys(("Posterize", "Solarize", "Invert", "Brightness"), 2),
    **{name: KINDS.index(name) for name in KINDS[3:]},
}
POLICIES = ("randaugment", "trivialaugment", "autoaugment_imagenet", "autoaugment_cifar10", "autoaugment_svhn")


class Entries(NamedTuple):
    """Operations with their magnitudes and precomputed parameters, (E,) each: a policy's table, or one per image."""

    op: torch.Tensor  # (E,) ids of OPS
    mag: torch.Tensor  # (E,) float, signed
    kind: torch.Tensor  # (E,) ids of KINDS
    theta: torch.Tensor  # (E, 3, 2) pixel-centre coordinates -> normalised sampling grid (identity if not geometric)
    lut: torch.Tensor  # (E, 256) uint8 lookup table (identity if not a Lookup)
    base: torch.Tensor  # (H*W, 3) pixel centres from the image centre, 1 appended: the warp's grid is base @ theta


def _inverse_affine(angle, tx, ty, shear_x, shear_y, cx, cy) -> torch.Tensor:
    """torchvision's `_get_inverse_affine_matrix` (scale 1) for a batch of parameters, in float64 as torchvision
    computes it in Python floats: (E,) each, degrees and pixels -> (E, 2, 3)."""
    rot, sx, sy = torch.deg2rad(angle), torch.deg2rad(shear_x), torch.deg2rad(shear_y)
    a = torch.cos(rot - sy) / torch.cos(sy)
    b = -(a * torch.tan(sx) + torch.sin(rot))
    c = torch.sin(rot - sy) / torch.cos(sy)
    d = torch.cos(rot) - c * torch.tan(sx)
    m0, m1, m3, m4 = d, -b, -c, a
    m2 = cx - m0 * (cx + tx) - m1 * (cy + ty)
    m5 = cy - m3 * (cx + tx) - m4 * (cy + ty)
    return torch.stack([m0, m1, m2, m3, m4, m5], dim=-1).view(-1, 2, 3)


def _base_grid(H: int, W: int) -> torch.Tensor:
    """Pixel centres relative to the image centre with a 1 appended (torchvision's _affine_grid base): (H*W, 3)."""
    xs = torch.linspace((1.0 - W) * 0.5, (W - 1.0) * 0.5, W)
    ys = torch.linspace((1.0 - H) * 0.5, (H - 1.0) * 0.5, H)
    return torch.stack([xs.expand(H, W), ys[:, None].expand(H, W), torch.ones(H, W)], -1).view(-1, 3)


def entries(op: torch.Tensor, mag: torch.Tensor, H: int, W: int) -> Entries:
    """The parameters of operations `op` with signed magnitudes `mag` (E,) on H x W images, by torchvision's
    formulas: the affine matrix of `_get_inverse_affine_matrix` (nearest, fill 0), the lookup tables of its float
    formulas on the 256 values (truncated to uint8 as its `.to(uint8)`)."""
    m = mag.double()
    zero = torch.zeros_like(m)
    is_op = {name: op == OP[name] for name in OPS}
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
    )
    # grid = base @ theta: base (H*W, 3) pixel centres from the image centre; grid_sample wants them / (W/2, H/2)
    theta = (theta.transpose(1, 2) / torch.tensor([0.5 * W, 0.5 * H], dtype=torch.float64)).float()
    v = torch.arange(256)
    vf, mf = v.float(), mag.float()[:, None]  # (256,), (E, 1)
    bits = mag.trunc().long().clamp(0, 8)[:, None]  # Posterize keeps the top `bits` bits (8: unchanged)
    lut = v.expand(len(op), 256)
    for name, table in (
        ("Posterize", v & (((1 << bits) - 1) << (8 - bits))),
        ("Solarize", torch.where(vf >= 255.0 * mf, 255 - v, v)),  # invert the values >= threshold
        ("Invert", 255 - v),
        ("Brightness", (vf * (1.0 + mf)).clamp_(0, 255)),  # truncated below, as torchvision's .to(uint8)
    ):
        lut = torch.where(is_op[name][:, None], table.to(lut.dtype), lut)
    kind = torch.tensor([KIND_OF[name] for name in OPS])[op]
    return Entries(op=op, mag=mag.float(), kind=kind, theta=theta, lut=lut.to(torch.uint8), base=_base_grid(H, W))


def to_uint8(xf: torch.Tensor) -> torch.Tensor:
    """Float values in [0, 255] to uint8, truncated as torchvision's .to(uint8): through int16, 2-3x faster on CPU
    than float -> uint8 directly (0.14 vs 0.31-0.46 ms for 256 CIFAR images, torch 2.14)."""
    return xf.to(torch.int16).to(torch.uint8)


def _gray(xf: torch.Tensor) -> torch.Tensor:
    """torchvision's grayscale of a float batch with uint8 values, floored: (B, C, H, W) -> (B, 1, H, W)."""
    if xf.shape[1] == 1:
        return xf
    return xf[:, 0].mul(0.2989).add_(xf[:, 1], alpha=0.587).add_(xf[:, 2], alpha=0.114).floor_()[:, None]


# Three passes over the pixels cover every kind: a warp (Geometric), a lookup table per image and channel (Lookup,
# AutoContrast, Equalize, Contrast: each a function of the value given the image), a blend with a degenerate image
# (Color: the grayscale; Sharpness: the blurred interior). The table builders read only what their kind needs.


def _warp(x: torch.Tensor, theta: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """Affine warp, nearest, fill 0: x (n, C, H, W) uint8, theta (n, 3, 2) -> uint8 (nearest copies pixel values:
    exact in float32)."""
    n, C, H, W = x.shape
    grid = (base @ theta).view(n, H, W, 2)  # (H*W, 3) @ (n, 3, 2)
    out = F.grid_sample(x.float(), grid, mode="nearest", padding_mode="zeros", align_corners=False)
    return to_uint8(out)


def _rows_lookup(x: torch.Tensor, values: torch.Tensor, e) -> torch.Tensor:
    return e.lut[:, None].expand(x.shape[0], x.shape[1], 256).float()


def _rows_autocontrast(x: torch.Tensor, values: torch.Tensor, e) -> torch.Tensor:
    """Per channel, v -> (v - min) / ((max - min) / 255); a constant channel unchanged."""
    lo, hi = x.flatten(2).aminmax(dim=-1)
    lo, hi = lo.float()[..., None], hi.float()[..., None]  # (n, C, 1)
    flat = lo == hi
    inv_scale = torch.where(flat, 1.0, (hi - lo) * (1.0 / 255))
    return ((torch.arange(256.0, device=x.device) - torch.where(flat, 0.0, lo)) / inv_scale).clamp_(0, 255)


def _rows_equalize(x: torch.Tensor, values: torch.Tensor, e) -> torch.Tensor:
    """PIL's scheme as torchvision implements it, from the cumulative histogram. Counted in float32, exact for images
    under 2**24 pixels: int64 division made this builder 3x slower on CPU."""
    n, C, HW = values.shape
    hist = torch.zeros(n, C, 256, device=x.device).scatter_add_(-1, values, x.new_ones(1).float().expand_as(values))
    cum = hist.cumsum(-1)
    last = hist.gather(-1, x.flatten(2).amax(-1, keepdim=True).long())  # count of the largest value, (n, C, 1)
    step = ((HW - last) / 255).floor_()
    # v -> (number of pixels below v + step // 2) // step, so 0 -> 0
    lut = ((cum - hist + (step / 2).floor_()) / step.clamp(min=1)).floor_().clamp_(0, 255)
    return torch.where(step > 0, lut, torch.arange(256.0, device=x.device))  # a nearly constant channel stays


def _rows_contrast(x: torch.Tensor, values: torch.Tensor, e) -> torch.Tensor:
    """v -> v * factor + (1 - factor) * mean gray, factor 1 + magnitude (torchvision's _blend with the mean)."""
    m = e.mag[:, None, None]
    mean = _gray(x.float()).mean(dim=(-3, -2, -1))[:, None, None]  # (n, 1, 1)
    rows = (torch.arange(256.0, device=x.device) * (1.0 + m) + (-m) * mean).clamp_(0, 255)
    return rows.expand(x.shape[0], x.shape[1], 256)


def _by_table(values: torch.Tensor, rows: torch.Tensor, shape) -> torch.Tensor:
    """Each image and channel through its own table: values (n, C, H*W) int64, rows (n, C, 256) float -> uint8.
    A gather along the value axis: 4x faster on CPU than indexing a flattened table with offsets (measured)."""
    return rows.to(torch.uint8).gather(-1, values).view(shape)  # .to(uint8) truncates, as torchvision's


def _color(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Saturation: x factor + gray (1 - factor), torchvision's _blend; x (n, C, H, W) uint8, w (n, 1, 1, 1) =
    1 - factor. In place on one float copy. One channel is left as it is (as PIL does)."""
    if x.shape[1] == 1:
        return x.clone()
    xf = x.float()
    gray = _gray(xf).mul_(w)
    return to_uint8(xf.mul_(1.0 - w).add_(gray).clamp_(0, 255))


def _sharpness(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x + (1 - factor) (blurred - x) as torchvision writes it, blurred by the 3x3 kernel [[1,1,1],[1,5,1],[1,1,1]]
    / 13 on the interior and rounded; the border kept. x (n, C, H, W) uint8, w (n, 1, 1, 1) = 1 - factor."""
    H, W = x.shape[-2:]
    if H <= 2 or W <= 2:
        return x.clone()
    xf = x.float()
    # as sums of shifted views, in place: a depthwise conv2d was 3x slower here (2-core CPU)
    rows = (xf[..., :-2, :] + xf[..., 1:-1, :]).add_(xf[..., 2:, :])  # (n, C, H-2, W)
    inner = xf[..., 1:-1, 1:-1]
    blurred = (rows[..., :-2] + rows[..., 1:-1]).add_(rows[..., 2:]).add_(inner, alpha=4).div_(13.0).round_()
    out = x.clone()
    out[..., 1:-1, 1:-1] = blurred.sub_(inner).mul_(w).add_(inner).clamp_(0, 255)  # (n, C, H-2, W-2)
    return out


TABLE_KINDS = {
    KINDS.index(k): f for k, f in zip(KINDS[2:6], (_rows_lookup, _rows_autocontrast, _rows_equalize, _rows_contrast))
}
COLOR, SHARPNESS, GEOMETRIC = KINDS.index("Color"), KINDS.index("Sharpness"), KINDS.index("Geometric")


class _Lazy:
    """Entries `idx` of a table, each field gathered when read (a table builder reads at most one)."""

    def __init__(self, table: Entries, idx: torch.Tensor):
        self.table, self.idx = table, idx

    def __getattr__(self, name: str) -> torch.Tensor:
        return getattr(self.table, name)[self.idx]


def apply_entries(x: torch.Tensor, table: Entries, entry: torch.Tensor, sort: bool | None = None) -> torch.Tensor:
    """One slot: image b gets the operation of table entry `entry[b]`. x (B, C, H, W) uint8 -> a new batch.

    On GPU (`sort` False) each pass runs on the whole batch and each image keeps the result of its own: no
    data-dependent shapes, nothing waits for the device. On CPU (`sort` True) there is no device to wait for and a
    pass over an image that keeps x is time lost: the batch is sorted by kind (KINDS' order puts the table kinds and
    the blend kinds next to each other) and each pass transforms its slice in place. Both give the same result
    (tested) and dispatch the same number of operators for any batch size (an empty slice runs too)."""
    if sort is None:
        sort = x.device.type == "cpu"
    B, C, H, W = x.shape
    kind = table.kind[entry]
    weight = -table.mag[entry][:, None, None, None]  # the blend weight, 1 - factor: (B, 1, 1, 1)
    if not sort:
        e = _Lazy(table, entry)
        values = x.view(B, C, H * W).long()
        rows = torch.zeros(B, C, 256, device=x.device)
        for k, build in TABLE_KINDS.items():
            rows = torch.where((kind == k)[:, None, None], build(x, values, e), rows)
        out = torch.where((kind == GEOMETRIC)[:, None, None, None], _warp(x, e.theta, table.base), x)
        is_table = (kind > GEOMETRIC) & (kind < COLOR)
        out = torch.where(is_table[:, None, None, None], _by_table(values, rows, x.shape), out)
        out = torch.where((kind == COLOR)[:, None, None, None], _color(x, weight), out)
        return torch.where((kind == SHARPNESS)[:, None, None, None], _sharpness(x, weight), out)
    order = kind.argsort()
    end = torch.bincount(kind, minlength=len(KINDS)).cumsum(0).tolist()  # a host read: free on CPU
    xs, entry, weight = x.index_select(0, order), entry[order], weight[order]
    part = slice(end[0], end[GEOMETRIC])
    xs[part] = _warp(xs[part], table.theta[entry[part]], table.base)
    first, last = end[GEOMETRIC], end[max(TABLE_KINDS)]  # the table kinds' images: xs[first:last]
    values = xs[first:last].view(-1, C, H * W).long()
    rows = []
    for k, build in TABLE_KINDS.items():
        part = slice(end[k - 1], end[k])
        local = slice(end[k - 1] - first, end[k] - first)
        rows.append(build(xs[part], values[local], _Lazy(table, entry[part])))
    xs[first:last] = _by_table(values, torch.cat(rows), (-1, C, H, W))
    for k, blend in ((COLOR, _color), (SHARPNESS, _sharpness)):
        part = slice(end[k - 1], end[k])
        xs[part] = blend(xs[part], weight[part])
    # back to the input order: index_copy_ of uint8 is 10x slower on CPU than this gather (0.86 vs 0.09 ms, measured)
    return xs.index_select(0, order.argsort())


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

    def _table(self, H: int, W: int, device) -> tuple[Entries, dict]:
        """Per (H, W, device): the policy's entries (0: Identity; then each operation and magnitude it can draw,
        positive then negative) and where to find them: `pos`/`neg` entry indices shaped as the policy's draws
        (AutoAugment: (sub-policies, 2) with their probabilities `p`; RandAugment: (ops,); Trivial: (ops, bins))."""
        key = (H, W, str(device))
        if key in self._tables:
            return self._tables[key]
        ops, mags = [OP["Identity"]], [0.0]

        def add(name: str, magnitude: float, signed: bool) -> tuple[int, int]:
            ops.extend([OP[name], OP[name]])
            mags.extend([magnitude, -magnitude if signed else magnitude])
            return len(ops) - 2, len(ops) - 1

        where = {}
        if self.policy.startswith("autoaugment"):
            name = {"imagenet": "IMAGENET", "cifar10": "CIFAR10", "svhn": "SVHN"}[self.policy.split("_")[1]]
            space = v2.AutoAugment._AUGMENTATION_SPACE
            pos, neg, probs = [], [], []
            for sub in v2.AutoAugment(getattr(v2.AutoAugmentPolicy, name))._policies:
                for transform_id, p, idx in sub:
                    fn, signed = space[transform_id]
                    table = fn(10, H, W)
                    i, j = add(transform_id, float(table[idx]) if table is not None else 0.0, signed)
                    pos.append(i), neg.append(j), probs.append(p)
            where = {"pos": pos, "neg": neg, "p": probs}
            where = {k: torch.tensor(v, device=device).view(-1, 2) for k, v in where.items()}
        else:
            space = (v2.RandAugment if self.policy == "randaugment" else v2.TrivialAugmentWide)._AUGMENTATION_SPACE
            bins = [self.magnitude] if self.policy == "randaugment" else range(self.bins)
            pos, neg = [], []
            for op_name, (fn, signed) in space.items():
                table = fn(self.bins, H, W)
                for b in bins:
                    i, j = add(op_name, float(table[b]) if table is not None else 0.0, signed)
                    pos.append(i), neg.append(j)
            shape = (len(space),) if self.policy == "randaugment" else (len(space), self.bins)
            where = {"pos": torch.tensor(pos, device=device).view(shape), "neg": torch.tensor(neg, device=device)}
            where["neg"] = where["neg"].view(shape)
        table = entries(torch.tensor(ops), torch.tensor(mags, dtype=torch.float64), H, W)
        self._tables[key] = (Entries(*(t.to(device) for t in table)), where)
        return self._tables[key]

    def draw(self, B: int, H: int, W: int, generator: torch.Generator, device=None) -> torch.Tensor:
        """Each image's entries, as torchvision draws operations, magnitudes and signs: (B, slots) indices."""
        device = device or generator.device
        _, t = self._table(H, W, device)

        def rand(*shape):
            return torch.rand(*shape, generator=generator, device=generator.device).to(device)

        def randint(n, *shape):
            return torch.randint(n, shape, generator=generator, device=generator.device).to(device)

        if self.policy.startswith("autoaugment"):
            sub = randint(t["pos"].shape[0], B)  # one sub-policy per image
            pos, neg, p = t["pos"][sub], t["neg"][sub], t["p"][sub]  # (B, 2)
            entry = torch.where(rand(B, 2) <= 0.5, neg, pos)  # an unsigned operation's "neg" is itself
            return torch.where(rand(B, 2) <= p, entry, 0)  # the coin says no: Identity
        if self.policy == "randaugment":
            k = randint(t["pos"].shape[0], B, self.num_ops)
            return torch.where(rand(B, self.num_ops) <= 0.5, t["neg"][k], t["pos"][k])
        k, bin_ = randint(t["pos"].shape[0], B, 1), randint(self.bins, B, 1)  # trivialaugment: one op, any bin
        return torch.where(rand(B, 1) <= 0.5, t["neg"][k, bin_], t["pos"][k, bin_])

    def sample(self, B: int, H: int, W: int, generator: torch.Generator, device=None):
        """Each image's operations and signed magnitudes: (B, slots) ids of OPS and floats."""
        entry = self.draw(B, H, W, generator, device)
        table, _ = self._table(H, W, entry.device)
        return table.op[entry], table.mag[entry]

    def apply(self, x: torch.Tensor, entry: torch.Tensor) -> torch.Tensor:
        """The drawn entries (B, slots) applied to x (B, C, H, W) uint8, slot after slot."""
        table, _ = self._table(x.shape[-2], x.shape[-1], x.device)
        for s in range(entry.shape[1]):
            x = apply_entries(x, table, entry[:, s])
        return x

    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return self.apply(x, self.draw(x.shape[0], x.shape[-2], x.shape[-1], generator, x.device))
