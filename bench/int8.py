"""int8 ONNX against fp32 ONNX and the torch model on this CPU: speed at one batch size, and top-1 on a labelled folder.

    python bench/int8.py [--ckpt PATH --data VAL_FOLDER] [--batch-size 32] [--rounds 7] [--out bench/int8.json]

The three models are timed in this process, interleaved (torch, fp32, dynamic int8, static int8, then again), on the
same ready batch, median images/s of the rounds; ONNX Runtime and torch get the same threads. Without --ckpt, a model
of the size of configs/cifar10.yaml (384 wide, 7 deep, patch 4, 32 px) with random weights: speed only. With --ckpt
and --data (a folder of <class>/<image> files, e.g. the checkpoint's own validation images), every model's top-1
there, through vit-predict's preprocessing; static quantization calibrates on the first 256 of those images
(`--calibration`). Quantization is vit/deployment/export.py's `quantize_int8` (dynamic) and ONNX Runtime's
quantize_static (QDQ, per-channel weights) for comparison.
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from vit.data.images import expand_inputs, image_at, read_image
from vit.deployment.export import export, quantize_int8
from vit.deployment.onnx_model import OnnxClassifier
from vit.deployment.predict import normalize
from vit.model.checkpoint import load_model
from vit.model.vision_transformer import VisionTransformer


def labelled_images(folder: str, hp: dict, limit: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, C, S, S) normalised float32 images and (N,) labels of a <class>/<image> folder, as vit-predict reads them."""
    names = hp.class_names or sorted(p.name for p in Path(folder).iterdir() if p.is_dir())
    paths, labels = [], []
    for k, name in enumerate(names):
        found = expand_inputs([str(Path(folder, name))])
        paths += found
        labels += [k] * len(found)
    order = np.random.default_rng(0).permutation(len(paths))[:limit]
    x = torch.stack([image_at(read_image(paths[i], hp.in_chans), hp.img_size) for i in order])
    return normalize(x, hp.mean, hp.std), torch.tensor(labels)[order]


def static_int8(fp32: Path, out: Path, calibration: torch.Tensor) -> Path:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Batches(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{"images": b.numpy()} for b in calibration.split(32)])

        def get_next(self):
            return next(self.batches, None)

    quantize_static(str(fp32), str(out), Batches(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)  # fmt: skip
    return out


def top1(model, x: torch.Tensor, y: torch.Tensor, batch: int) -> float:
    with torch.inference_mode():
        pred = torch.cat([model(b).argmax(-1) for b in x.split(batch)])
    return float((pred == y).float().mean())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt")
    ap.add_argument("--data", help="a labelled folder for top-1 (needs --ckpt)")
    ap.add_argument("--limit", type=int, default=2000, help="at most this many images of --data")
    ap.add_argument("--calibration", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--out")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.ckpt:
        model, hp = load_model(a.ckpt)
    else:
        model = VisionTransformer(img_size=32, patch_size=4, embed_dim=384, depth=7, num_heads=6).eval()
        hp = SimpleNamespace(img_size=32, in_chans=3, mean=[0.5] * 3, std=[0.5] * 3)
    model = model.eval()
    data = labelled_images(a.data, hp, a.limit) if a.data and a.ckpt else None
    size, chans = hp.img_size, hp.in_chans
    calibration = data[0][: a.calibration] if data is not None else torch.randn(a.calibration, chans, size, size)
    with tempfile.TemporaryDirectory() as tmp:
        fp32 = export(model, "onnx", Path(tmp, "fp32.onnx"), size, chans)
        dynamic = quantize_int8(fp32, Path(tmp, "dynamic.onnx"))
        every = quantize_int8(fp32, Path(tmp, "every.onnx"), op_types=None)
        static = static_int8(fp32, Path(tmp, "static.onnx"), calibration)
        runners = {
            "torch": model,
            "onnx_fp32": OnnxClassifier(fp32, a.threads),
            "onnx_int8_dynamic": OnnxClassifier(dynamic, a.threads),
            "onnx_int8_dynamic_every_op": OnnxClassifier(every, a.threads),
            "onnx_int8_static": OnnxClassifier(static, a.threads),
        }
        sizes_mb = {k: round(Path(p).stat().st_size / 2**20, 2) for k, p in
                    (("onnx_fp32", fp32), ("onnx_int8_dynamic", dynamic), ("onnx_int8_dynamic_every_op", every),
                     ("onnx_int8_static", static))}  # fmt: skip
        x = torch.randn(a.batch_size, chans, size, size)
        speeds = {k: [] for k in runners}
        with torch.inference_mode():
            for r in runners.values():
                r(x)  # warm up: one-time allocations and kernel choices
            for _ in range(a.rounds):
                for k, r in runners.items():
                    t = time.perf_counter()
                    for _ in range(5):
                        r(x)
                    speeds[k].append(5 * a.batch_size / (time.perf_counter() - t))
        med = {k: statistics.median(v) for k, v in speeds.items()}
        result = {
            "model": f"{model.cfg.embed_dim} wide x {model.cfg.depth}, patch {model.cfg.patch_size}, {size} px",
            "batch_size": a.batch_size,
            "threads": a.threads,
            "rounds": a.rounds,
            "images_per_s": {k: round(v, 1) for k, v in med.items()},
            "int8_dynamic_over_fp32_onnx": round(med["onnx_int8_dynamic"] / med["onnx_fp32"], 2),
            "int8_dynamic_every_op_over_fp32_onnx": round(med["onnx_int8_dynamic_every_op"] / med["onnx_fp32"], 2),
            "int8_static_over_fp32_onnx": round(med["onnx_int8_static"] / med["onnx_fp32"], 2),
            "int8_dynamic_over_torch": round(med["onnx_int8_dynamic"] / med["torch"], 2),
            "file_mb": sizes_mb,
        }
        if data is not None:
            result["top1"] = {k: round(top1(r, *data, a.batch_size), 4) for k, r in runners.items()}
            result["top1_images"] = len(data[1])
    print(json.dumps(result, indent=2))
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
