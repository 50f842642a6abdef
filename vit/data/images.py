"""Image files as the model sees them: open any file the way training did, find the files a user names, and describe
the whole preprocessing in words another runtime can follow (the export sidecar, vit.deployment.export).

    paths = expand_inputs(["photos/", "more/*.jpg"])      # folders recursively, globs, files as given
    img = read_image(path, in_chans=3)                    # PIL image, 8-bit RGB (or L for 1-channel models) ...
    x = eval_geometry(img_size)(img)                      # ... uint8 (C, img_size, img_size)
    x = image_at(read_image("scan.png"), img_size)        # 16-bit, multi-band: float32 (C, S, S) in [0, 1]

Every decision here (16 bits kept, bands as stored, transparency on white, grayscale by PIL's luma) is made once, so
training, vit-predict, vit-serve, the attention commands and an exported model's sidecar agree.
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
# Integer grayscale wider than 8 bits: read as a float in [0, 1] (PIL's convert('L') clips 65535 -> 255).
WIDE_MODES = ("I;16", "I;16B", "I;16L", "I")
WHITE = (255, 255, 255)
LUMA = (0.299, 0.587, 0.114)  # PIL's convert('L') weights, for a wide RGB image read by a 1-channel model


def load_image(
    path,
    in_chans: int | None = 3,
    max_pixels: int | None = None,
    formats: tuple[str, ...] | None = None,
    draft: int = 0,
) -> Image.Image | torch.Tensor:
    """Open any image turned upright as its EXIF orientation says. An 8-bit image (grayscale, palette, RGBA composited
    on white, CMYK) as a PIL image, RGB (in_chans 3 or None) or L (in_chans 1). An image with more than 8 bits a
    sample (16-bit PNG or TIFF, 12-bit data stored in 16) or with bands beyond RGB (a multi-band TIFF) as a float32
    (C, H, W) tensor in [0, 1]: its values as stored, never through 8 bits (value / 65535 for 16-bit). in_chans None:
    the channels as the file has them (grey as 3 equal channels, a TIFF's bands all); else exactly in_chans of them
    (grey repeated, RGB to luma for 1), and a ValueError naming the counts when they cannot match.

    Args:
        max_pixels: refuse (Image.DecompressionBombError) an image whose size, after `draft`, is over this many
            pixels, from its header, before any pixel is decoded.
        formats: the PIL formats to accept (others: Image.UnidentifiedImageError); None: any.
        draft: for JPEG, decode at the smallest of PIL's 1/2, 1/4, 1/8 scales whose shorter side stays >= draft (the
            decoder skips the work: a 48-MP photo for a 224-px model decodes at 1/8 of its pixels).
    """
    try:
        img = Image.open(path, formats=formats)
    except Image.UnidentifiedImageError:  # PIL knows no planar multi-band TIFF: tifffile does
        if (formats is None or "TIFF" in formats) and _is_tiff(path):
            return match_bands(read_tiff(path, max_pixels), in_chans)
        raise
    if draft and img.format == "JPEG":
        w, h = img.size
        scale = draft / min(w, h)
        img.draft(img.mode, (max(1, int(w * scale)), max(1, int(h * scale))))
    if max_pixels is not None and img.size[0] * img.size[1] > max_pixels:
        w, h = img.size
        raise Image.DecompressionBombError(
            f"Image size ({w * h} pixels) exceeds limit of {max_pixels} pixels, could be decompression bomb DOS attack."
        )
    if img.format == "TIFF" and _beyond_pil(img):
        return match_bands(read_tiff(path, max_pixels), in_chans)
    img.load()
    # A phone stores its photos as the sensor read them, with the turn to upright in EXIF's Orientation tag; every
    # viewer applies it, so training, predict and serve do too (in place: no copy when there is none to apply).
    ImageOps.exif_transpose(img, in_place=True)
    if img.mode in WIDE_MODES:
        return match_bands(torch.from_numpy(wide_values(img).astype(np.float32))[None], in_chans)
    if in_chans not in (None, 1, 3):
        raise ValueError(f"an 8-bit {img.mode} image has 3 bands or fewer, and the model takes {in_chans}")
    return convert_image(img, in_chans or 3)


def _beyond_pil(img: Image.Image) -> bool:
    """A TIFF whose pixels PIL would cut down: more than 4 samples (PIL reads the first), several grey planes (bands,
    not RGB), or several samples of more than 8 bits (PIL keeps 8)."""
    samples, photometric = img.tag_v2.get(277, 1), img.tag_v2.get(262, 2)
    bits = img.tag_v2.get(258, (8,))
    bits = max(bits) if isinstance(bits, tuple) else bits
    return samples > 4 or (samples > 1 and (photometric in (0, 1) or bits > 8))


def _is_tiff(path) -> bool:
    """The file starts as a TIFF does (II*, MM*, or BigTIFF's II+, MM+)."""
    if hasattr(path, "read"):
        path.seek(0)
        head = path.read(4)
        path.seek(0)
    else:
        with open(path, "rb") as f:
            head = f.read(4)
    return head in (b"II*\0", b"MM\0*", b"II+\0", b"MM\0+")


def tiff_size(path) -> tuple[int, int] | None:
    """(width, height) of a TIFF's first image from its header (for what PIL cannot open), or None: not a TIFF."""
    if not _is_tiff(path):
        return None
    import tifffile

    with tifffile.TiffFile(path) as tif:
        return tif.pages[0].imagewidth, tif.pages[0].imagelength


def read_tiff(path, max_pixels: int | None = None) -> torch.Tensor:
    """A TIFF's first image, every band, as float32 (C, H, W): integers over their type's maximum (uint16 / 65535),
    floats as stored. tifffile reads what PIL cannot (bands beyond 4, 16-bit RGB, planar layouts); an image over
    max_pixels is refused from its header (Image.DecompressionBombError), before its pixels are read."""
    try:
        import tifffile
    except ImportError:
        raise ValueError("a multi-band or 16-bit TIFF needs tifffile (pip install tifffile)") from None
    if hasattr(path, "seek"):
        path.seek(0)
    with tifffile.TiffFile(path) as tif:
        page = tif.pages[0]
        if max_pixels is not None and page.imagewidth * page.imagelength > max_pixels:
            n = page.imagewidth * page.imagelength
            raise Image.DecompressionBombError(f"Image size ({n} pixels) exceeds limit of {max_pixels} pixels")
        arr, axes = page.asarray(), page.axes  # e.g. (H, W, S) 'YXS' (interleaved) or (S, H, W) 'SYX' (planar)
    if arr.ndim == 2:
        arr = arr[None]
    elif axes.endswith("S"):
        arr = arr.transpose(2, 0, 1)
    top = float(np.iinfo(arr.dtype).max) if np.issubdtype(arr.dtype, np.integer) else 1.0
    return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32) / top)


def match_bands(x: torch.Tensor, in_chans: int | None) -> torch.Tensor:
    """(C, H, W) -> (in_chans, H, W): grey repeated, RGB to luma for 1; None: grey as 3, other counts kept."""
    c = x.shape[0]
    want = (3 if c == 1 else c) if in_chans is None else in_chans
    if c == want:
        return x
    if c == 1:
        return x.expand(want, -1, -1).contiguous()
    if c == 3 and want == 1:
        return torch.tensordot(torch.tensor(LUMA), x, dims=1)[None]
    raise ValueError(f"{c} bands, and the model takes {want}")  # the caller names the file


def wide_values(img: Image.Image) -> np.ndarray:
    """A wide grey image's values in [0, 1], float64: / 65535 for 16-bit modes (and for mode I past 255), else / 255."""
    arr = np.asarray(img, dtype=np.float64)
    return arr / (65535.0 if img.mode.startswith("I;16") or arr.max() > 255 else 255.0)


def convert_image(img: Image.Image, in_chans: int = 3) -> Image.Image:
    """A decoded PIL image of any mode as 8-bit RGB (in_chans 3) or L (in_chans 1): load_image's conversion of 8-bit
    files, and of every image a torchvision dataset hands out (a wide one scaled to 8 bits there)."""
    if img.mode in WIDE_MODES:
        img = Image.fromarray(np.clip(wide_values(img) * 255.0 + 0.5, 0, 255).astype(np.uint8))
    if img.mode in ALPHA_MODES:
        # A palette image may or may not carry transparency: through RGBA either way (opaque pixels are unchanged).
        img = Image.alpha_composite(Image.new("RGBA", img.size, (*WHITE, 255)), img.convert("RGBA"))
    return img.convert("L" if in_chans == 1 else "RGB")


def read_image(path, in_chans: int | None = 3, **kwargs) -> Image.Image | torch.Tensor:
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
    """Shorter side to img_size, centre crop: PIL image -> uint8 (C, img_size, img_size) tensor (a float tensor
    from load_image stays float)."""
    return v2.Compose([v2.ToImage(), v2.Resize(img_size, antialias=True), v2.CenterCrop(img_size)])


def image_at(img, img_size: int) -> torch.Tensor:
    """A decoded image (load_image's) -> (C, img_size, img_size), uint8 or float32 as decoded: shorter side resized,
    centre crop (identity at size)."""
    if isinstance(img, Image.Image) and img.size == (img_size, img_size):
        return pil_to_tensor(img)
    return eval_geometry(img_size)(img).as_subclass(torch.Tensor)


def same_dtype(images: list[torch.Tensor]) -> list[torch.Tensor]:
    """Decoded images of one batch or one store in one dtype: all uint8 as they are; once any is float (16-bit,
    multi-band), the 8-bit ones as float too (/ 255), so that every value is on one [0, 1] scale."""
    if not any(x.is_floating_point() for x in images):
        return images
    return [x if x.is_floating_point() else x.float().div_(255) for x in images]


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
    `path: error: reason`, as vit-predict reports it, and passed over (one bad file must not stop the rest)."""
    for path in paths:
        try:
            yield path, transform(read_image(path, in_chans))
        except Exception as e:  # any failure is a reason to report
            print(f"{path}: error: {describe(e)}", file=sys.stderr)


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
            "step": "wide_pixels",
            "modes": list(WIDE_MODES),
            "how": "kept wide, never through 8 bits: float32 value / 65535 for 16-bit modes (mode I: / 65535 when its "
            "maximum exceeds 255, else / 255), one band (repeated for 3 channels); a TIFF with more than 4 samples, "
            "several grey planes or samples over 8 bits: its first page's every band (tifffile), integers / their "
            "type's maximum; the steps below then work per band in PIL mode F, and to_float does not divide",
        },
        {
            "step": "composite_alpha",
            "modes": list(ALPHA_MODES),
            "background": list(WHITE),
            "how": "convert to RGBA, then alpha-composite over an opaque white image of the same size",
        },
        {"step": "convert", "mode": mode, "how": f"PIL Image.convert('{mode}')"}
        if in_chans in (1, 3)
        else {"step": "convert", "mode": f"{in_chans} bands", "how": "none: the TIFF's bands as wide_pixels read them"},
        {
            "step": "resize",
            "size": img_size,
            "how": "shorter side to size, longer side scaled to keep the aspect ratio (truncated), bilinear, "
            "antialiased (PIL Image.resize(..., Image.BILINEAR))",
        },
        {"step": "center_crop", "size": [img_size, img_size]},
        {
            "step": "to_float",
            "how": "uint8 -> float32 / 255 (wide pixels are float already), channels first: (B, C, H, W)",
        },
        {"step": "normalize", "mean": list(mean), "std": list(std), "how": "(x - mean) / std per channel"},
    ]
