"""Image files as the model sees them: open any file the way training did, find the files a user names, and describe
the whole preprocessing in words another runtime can follow (the export sidecar, vit.deployment.export).

    paths = expand_inputs(["photos/", "more/*.jpg"])      # folders recursively, globs, files as given
    img = read_image(path, in_chans=3)                    # PIL image, 8-bit RGB (or L for 1-channel models)
    x = eval_geometry(img_size)(img)                      # uint8 (C, img_size, img_size)

Every decision here (16-bit scaling, transparency on white, grayscale by PIL's luma) is made once, so training,
vit-predict, vit-serve, the attention commands and an exported model's sidecar agree.
"""

import glob
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps
from torchvision.datasets.folder import IMG_EXTENSIONS
from torchvision.transforms import v2
from torchvision.transforms.functional import pil_to_tensor

# Modes with transparency: composited on white, as a person sees them on a page.
ALPHA_MODES = ("RGBA", "LA", "PA", "P")
# Integer grayscale wider than 8 bits: PIL's convert('L') clips (65535 -> 255) instead of scaling.
WIDE_MODES = ("I;16", "I;16B", "I;16L", "I")
WHITE = (255, 255, 255)


def load_image(
    path, in_chans: int = 3, max_pixels: int | None = None, formats: tuple[str, ...] | None = None, draft: int = 0
) -> Image.Image:
    """Open any image as 8-bit RGB (in_chans 3) or L (in_chans 1), turned upright as its EXIF orientation says:
    grayscale, palette, RGBA (composited on white), CMYK and 16-bit included.

    Args:
        max_pixels: refuse (Image.DecompressionBombError) an image whose size, after `draft`, is over this many
            pixels, from its header, before any pixel is decoded.
        formats: the PIL formats to accept (others: Image.UnidentifiedImageError); None: any.
        draft: for JPEG, decode at the smallest of PIL's 1/2, 1/4, 1/8 scales whose shorter side stays >= draft (the
            decoder skips the work: a 48-MP photo for a 224-px model decodes at 1/8 of its pixels).
    """
    img = Image.open(path, formats=formats)
    if draft and img.format == "JPEG":
        w, h = img.size
        scale = draft / min(w, h)
        img.draft(img.mode, (max(1, int(w * scale)), max(1, int(h * scale))))
    if max_pixels is not None and img.size[0] * img.size[1] > max_pixels:
        w, h = img.size
        raise Image.DecompressionBombError(
            f"Image size ({w * h} pixels) exceeds limit of {max_pixels} pixels, could be decompression bomb DOS attack."
        )
    img.load()
    # A phone stores its photos as the sensor read them, with the turn to upright in EXIF's Orientation tag; every
    # viewer applies it, so training, predict and serve do too (in place: no copy when there is none to apply).
    ImageOps.exif_transpose(img, in_place=True)
    return convert_image(img, in_chans)


def convert_image(img: Image.Image, in_chans: int = 3) -> Image.Image:
    """A decoded PIL image of any mode as 8-bit RGB (in_chans 3) or L (in_chans 1), as load_image returns it: the
    one conversion for files and for the images a torchvision dataset hands out."""
    if img.mode in WIDE_MODES:
        arr = np.asarray(img, dtype=np.float64)
        top = 65535.0 if img.mode.startswith("I;16") or arr.max() > 255 else 255.0
        img = Image.fromarray(np.clip(arr / top * 255.0 + 0.5, 0, 255).astype(np.uint8))
    if img.mode in ALPHA_MODES:
        # A palette image may or may not carry transparency: through RGBA either way (opaque pixels are unchanged).
        img = Image.alpha_composite(Image.new("RGBA", img.size, (*WHITE, 255)), img.convert("RGBA"))
    return img.convert("L" if in_chans == 1 else "RGB")


def read_image(path, in_chans: int = 3, **kwargs) -> Image.Image:
    """load_image that refuses what PIL only warns about (a declared size over Image.MAX_IMAGE_PIXELS), checked on
    the header itself: a process-wide warnings filter is not safe while other threads decode."""
    kwargs.setdefault("max_pixels", Image.MAX_IMAGE_PIXELS)
    return load_image(path, in_chans, **kwargs)


def describe(e: BaseException) -> str:
    """A short reason for a failed image."""
    if isinstance(e, FileNotFoundError):
        return "no such file"
    if isinstance(e, IsADirectoryError):
        return "is a folder"
    if isinstance(e, PermissionError):
        return "permission denied"
    if isinstance(e, (Image.DecompressionBombError, Image.DecompressionBombWarning)):
        return f"refused: declared size too large (decompression bomb?): {e}".split(". ")[0]
    if isinstance(e, Image.UnidentifiedImageError):
        return "not an image (or an empty file)"
    return " ".join(str(e).split()) or type(e).__name__


def eval_geometry(img_size: int) -> v2.Compose:
    """Shorter side to img_size, centre crop: PIL image -> uint8 (C, img_size, img_size) tensor."""
    return v2.Compose([v2.ToImage(), v2.Resize(img_size, antialias=True), v2.CenterCrop(img_size)])


def image_at(img, img_size: int) -> torch.Tensor:
    """A decoded PIL image -> uint8 (C, img_size, img_size): shorter side resized, centre crop (identity at size)."""
    if img.size == (img_size, img_size):
        return pil_to_tensor(img)
    return eval_geometry(img_size)(img)


def expand_inputs(inputs: Iterable[str]) -> list[str]:
    """Files as given, folders searched recursively for image extensions, globs expanded (`**` too), in order.
    A path that exists nowhere is kept, so that it is reported as an error rather than silently dropped."""
    paths: list[str] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            found = sorted(str(f) for f in p.rglob("*") if f.suffix.lower() in IMG_EXTENSIONS and not f.is_dir())
            paths.extend(found)
        elif p.exists() or p.is_symlink():
            paths.append(item)
        elif glob.has_magic(item):
            paths.extend(sorted(f for f in glob.glob(item, recursive=True) if not os.path.isdir(f)))
        else:
            paths.append(item)
    return list(dict.fromkeys(paths))  # no duplicates, order kept


def read_or_report(
    paths: Iterable[str], transform: Callable[[Image.Image], torch.Tensor], in_chans: int = 3
) -> Iterator[tuple[str, torch.Tensor]]:
    """(path, transform(image)) for each readable file; each unreadable one is reported on stderr as
    `path: skipped: reason` and passed over (one bad file must not stop the rest)."""
    for path in paths:
        try:
            yield path, transform(read_image(path, in_chans))
        except Exception as e:  # any failure is a reason to report
            print(f"{path}: skipped: {describe(e)}", file=sys.stderr)


def preprocess_spec(img_size: int, in_chans: int, mean, std) -> list[dict]:
    """Every step from an image file to the model's input, in order, as data: what load_image, eval_geometry and the
    normalisation do, written so that a runtime without this toolkit (onnxruntime and PIL, say) can repeat them."""
    mode = "L" if in_chans == 1 else "RGB"
    return [
        {
            "step": "exif_transpose",
            "how": "turn the image upright as its EXIF Orientation tag (0x0112) says, as PIL ImageOps.exif_transpose",
        },
        {
            "step": "scale_wide_grayscale",
            "modes": list(WIDE_MODES),
            "how": "to 8 bits: value / 65535 * 255 for 16-bit modes (and for mode I when its maximum exceeds 255, "
            "else value / 255 * 255), rounded half up, clipped to [0, 255]; result mode L",
        },
        {
            "step": "composite_alpha",
            "modes": list(ALPHA_MODES),
            "background": list(WHITE),
            "how": "convert to RGBA, then alpha-composite over an opaque white image of the same size",
        },
        {"step": "convert", "mode": mode, "how": f"PIL Image.convert('{mode}')"},
        {
            "step": "resize",
            "size": img_size,
            "how": "shorter side to size, longer side scaled to keep the aspect ratio (truncated), bilinear, "
            "antialiased (PIL Image.resize(..., Image.BILINEAR))",
        },
        {"step": "center_crop", "size": [img_size, img_size]},
        {"step": "to_float", "how": "uint8 -> float32 / 255, channels first: (B, C, H, W)"},
        {"step": "normalize", "mean": list(mean), "std": list(std), "how": "(x - mean) / std per channel"},
    ]
