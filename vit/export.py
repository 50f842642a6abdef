"""Export a trained model to ONNX or TorchScript, batch dimension dynamic.

    python -m vit.export --ckpt checkpoints/digits/version_0/last.ckpt --format onnx --out vit.onnx

The graph holds the model alone: input (B, 3, img_size, img_size) float32, already resized and normalised;
output (B, num_classes) logits. A `<out>.json` beside it records img_size, mean, std and class_names, which is all
another runtime needs to feed it.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

from vit.checkpoint import load_model_or_report


def export(
    model: torch.nn.Module, fmt: str, out: str | Path, img_size: int, in_chans: int = 3, opset: int = 18
) -> Path:
    """Write `model` (eval mode) as ONNX (dynamo exporter, SDPA kept fused where the opset allows) or TorchScript."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    model = model.eval()
    example = torch.randn(2, in_chans, img_size, img_size)
    if fmt == "onnx":
        batch = torch.export.Dim("batch", min=1, max=4096)
        program = torch.onnx.export(
            model,
            (example,),
            dynamo=True,
            input_names=["images"],
            output_names=["logits"],
            dynamic_shapes={"x": {0: batch}},
            opset_version=opset,
            verbose=False,
        )
        program.save(str(out))
    elif fmt == "torchscript":
        with torch.no_grad():
            traced = torch.jit.trace(model, example)
        traced.save(str(out))
    else:
        raise ValueError(f"format={fmt!r} is not one of ['onnx', 'torchscript']")
    return out


def build_parser() -> argparse.ArgumentParser:
    """The command line (the README's commands are checked against it)."""
    ap = argparse.ArgumentParser(
        prog="vit-export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--format", choices=("onnx", "torchscript"), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--opset", type=int, default=18, help="ONNX opset (>= 14 for attention; default 18)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    loaded = load_model_or_report(args.ckpt)
    if loaded is None:
        return 2
    model, hp = loaded
    out = export(model, args.format, args.out, hp["img_size"], hp.get("in_chans", 3), args.opset)
    meta = {
        "input": "images",
        "shape": ["B", hp.get("in_chans", 3), hp["img_size"], hp["img_size"]],
        "mean": hp["mean"],
        "std": hp["std"],
        "class_names": hp.get("class_names"),
        "preprocess": "RGB, resize shorter side to img_size (bilinear, antialias), centre crop, /255, (x - mean) / std",
    }
    Path(f"{out}.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"wrote {out} and {out}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
