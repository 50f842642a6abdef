"""Per-image crops, flips and Random Erasing of a whole batch, with torchvision's sampling rules.

Each transform is split into a sampler (all images' parameters at once, as torchvision's `get_params` draws them one
image at a time) and an application (the whole batch, a fixed number of tensor operations), so the in-memory path can
draw a whole epoch's parameters at once (vit/data/device.py):

    boxes = random_resized_crop_boxes(B, H, W, generator, scale=(0.35, 1.0))
    x = resized_crop(x_uint8, boxes, size)            # (B, C, H, W) -> (B, C, size, size)
    x = crop_flip(x_uint8, *crop_flip_params(B, 4, True, generator), padding=4)
    x = erase(x_float, random_erasing_boxes(B, H, W, 0.25, generator))   # after Normalize, value 0
    x = quarter_turn(x_uint8, quarter_turn_params(B, generator))     # square images: 0-3 quarter turns each
"""

import math

import torch
import torch.nn.functional as F

from vit.data.augment import to_uint8


def crop_flip_params(B: int, padding: int, hflip: bool, generator: torch.Generator, device=None) -> tuple:
    """RandomCrop(padding)'s offsets and RandomHorizontalFlip's coins for B images: (oy, ox, flip), (B,) each (every
    offset in [0, 2 * padding] equally likely; flip None without hflip)."""
    device = device or generator.device
    oy, ox = torch.randint(0, 2 * padding + 1, (2, B), generator=generator, device=generator.device).to(device)
    flip = torch.rand(B, generator=generator, device=generator.device).to(device) < 0.5 if hflip else None
    return oy, ox, flip


def crop_flip(x: torch.Tensor, oy: torch.Tensor, ox: torch.Tensor, flip: torch.Tensor | None, padding: int):
    """Crop each image of the zero-padded batch at its offset back to the input size, and flip it left-right where
    `flip`: (B, C, H, W) -> (B, C, H, W). Every output row is a run of W bytes somewhere in the padded batch (flipped
    images: in a flipped copy), so the crop is one index_select of B * C * H rows from a view of all runs: 1.5x
    faster on CPU than one gather per pixel (0.75 vs 1.1 ms for 256 CIFAR images)."""
    B, C, H, W = x.shape
    dev = x.device
    p = padding
    img = torch.arange(B, device=dev)  # which padded image each output comes from
    if flip is not None:
        # the crop at ox, flipped, is the crop at 2p - ox of the flipped image: flipped copies after the originals
        x = torch.cat([x, x.flip(-1)])
        img, ox = torch.where(flip, img + B, img), torch.where(flip, 2 * p - ox, ox)
    Hp, Wp = H + 2 * p, W + 2 * p
    flat = F.pad(x, (p,) * 4).view(-1)  # zeros, as RandomCrop's default fill
    chan = img[:, None] * C + torch.arange(C, device=dev)  # (B, C): index of each (image, channel) plane
    row = oy[:, None] + torch.arange(H, device=dev)  # (B, H)
    start = (chan[:, :, None] * Hp + row[:, None, :]) * Wp + ox[:, None, None]  # (B, C, H): where each row starts
    runs = flat.as_strided((flat.numel() - W + 1, W), (1, 1))  # runs[s] = flat[s : s + W], a view
    return runs.index_select(0, start.view(-1)).view(B, C, H, W)


def quarter_turn_params(B: int, generator: torch.Generator, device=None) -> torch.Tensor:
    """Quarter turns for B images, (B,) int in 0..3, each equally likely (with a horizontal flip: the 8 symmetries of
    the square, the dihedral group D4)."""
    device = device or generator.device
    return torch.randint(0, 4, (B,), generator=generator, device=generator.device).to(device)


def quarter_turn(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Rotate each square image k[i] quarter turns anticlockwise, as torch.rot90(x[i], k[i], (-2, -1)):
    (B, C, S, S) -> (B, C, S, S). The four turns of the whole batch are views (transpose and flips) picked per image by
    torch.where: a fixed number of operations, no host read of k."""
    if x.shape[-1] != x.shape[-2]:
        raise ValueError(f"quarter turns need square images, got {x.shape[-2]}x{x.shape[-1]}")
    k = k.view(-1, 1, 1, 1)
    t = x.transpose(-2, -1)
    out = torch.where(k == 1, t.flip(-2), x)  # rot90(x, 1) = flip rows of the transpose
    out = torch.where(k == 2, x.flip(-2, -1), out)
    return torch.where(k == 3, t.flip(-1), out)


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
    coordinates clamped inside the crop). x (B, C, H, W) uint8 (or float32), boxes (B, 4) top, left, h, w ->
    (B, C, size, size)."""
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
    return out if x.is_floating_point() else to_uint8(out.round_().clamp_(0, 255))  # float pixels stay float


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
    """Set each image's box to `value`: x (B, C, H, W) float, boxes (B, 4) top, left, h, w (h = 0: untouched).

    A multiply by a (B, 1, H, W) keep mask: 10x faster on CPU than masked_fill_ with the same broadcast mask
    (0.017 vs 0.18 ms for 64 CIFAR images), so the whole batch is done at once. x must be finite (0 * inf is nan)."""
    H, W = x.shape[-2:]
    top, left, h, w = (b[:, None] for b in boxes.unbind(1))
    rows = torch.arange(H, device=x.device)[None]
    cols = torch.arange(W, device=x.device)[None]
    in_r = ((rows >= top) & (rows < top + h)).to(x.dtype)  # (B, H)
    in_c = ((cols >= left) & (cols < left + w)).to(x.dtype)  # (B, W)
    inside = in_r[:, None, :, None] * in_c[:, None, None, :]  # (B, 1, H, W), 1 in the box
    out = x.mul_(1 - inside) if inplace else x * (1 - inside)
    return out.add_(inside * value) if value != 0 else out


def random_erasing(
    x: torch.Tensor, p: float, generator: torch.Generator, value: float = 0.0, inplace: bool = False
) -> torch.Tensor:
    """RandomErasing of each image of a batch with probability p (after Normalize: value 0 is the mean colour).
    `inplace` writes into x instead of a copy (the in-memory path passes its fresh batch)."""
    boxes = random_erasing_boxes(x.shape[0], x.shape[-2], x.shape[-1], p, generator, device=x.device)
    return erase(x, boxes, value, inplace=inplace)
