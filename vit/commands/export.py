"""`vit-export`: a trained model as ONNX or TorchScript, batch dimension dynamic, with its preprocessing beside it;
or as timm weights.

    vit-export --ckpt checkpoints/digits/version_0/last.ckpt --format onnx --out vit.onnx
    vit-export --ckpt checkpoints/digits/version_0/last.ckpt --format onnx --quantize int8 --out vit-int8.onnx
    vit-export --ckpt checkpoints/digits/version_0/last.ckpt --format timm --out vit_timm/

The graph holds the model alone: input `images` (B, in_chans, img_size, img_size) float32, already preprocessed;
outputs `logits` (B, num_classes) and `features` (B, depth + 1, embed_dim: the pooled tokens after the patch
embedding and every block, which the rejection of unknown images reads). `<out>.json` beside it holds img_size,
in_chans, mean, std, class_names, the rejection's score and threshold, and every preprocessing step from an image file
to that input (vit.data.images.preprocess_spec): what another runtime needs to feed it and get vit-predict's answers
(`vit-predict --onnx FILE` runs it); `<out>.unknown.safetensors` the rejection's statistics (float32), when the
checkpoint has a rejection record. `--quantize int8`: the matrix products in int8 (ONNX Runtime's dynamic
quantization), for CPUs. `--format timm` writes a folder in timm's Hugging Face layout:
model.safetensors and a config.json whose model_args build `timm.models.VisionTransformer(**model_args)` with the
same logits, and whose pretrained_cfg holds the mean, std and input size.
"""

import argparse
import sys
import tempfile
from pathlib import Path

from vit.commands.command_line import model_flags
from vit.deployment.export import export, export_timm, quantize_int8, write_sidecar
from vit.model.checkpoint import load_model_or_report
from vit.model.interop import InteropError


def build_parser() -> argparse.ArgumentParser:
    """The command line (the README's commands are checked against it)."""
    ap = argparse.ArgumentParser(
        prog="vit-export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    model_flags(ap)
    ap.add_argument("--format", choices=("onnx", "torchscript", "timm"), required=True)
    ap.add_argument("--out", "--output", dest="out", required=True)
    ap.add_argument("--opset", type=int, default=18, help="ONNX opset (>= 14 for attention; default 18)")
    ap.add_argument("--quantize", choices=("int8",), help="with --format onnx: int8 matrix products, for CPUs")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.quantize and args.format != "onnx":
        ap.error(f"--quantize {args.quantize} needs --format onnx")
    loaded = load_model_or_report(args.ckpt)
    if loaded is None:
        return 2
    model, record = loaded
    if args.format == "timm":
        try:
            out = export_timm(model, record, args.out)
        except InteropError as e:
            print(f"error: {args.ckpt}: {e}", file=sys.stderr)
            return 2
        print(f"wrote {out}/model.safetensors and {out}/config.json")
        return 0
    if args.quantize:
        with tempfile.TemporaryDirectory() as tmp:
            fp32 = export(model, "onnx", Path(tmp, "fp32.onnx"), record.img_size, record.in_chans, args.opset)
            out = quantize_int8(fp32, args.out)
    else:
        out = export(model, args.format, args.out, record.img_size, record.in_chans, args.opset)
    written = write_sidecar(out, record, quantized=args.quantize)
    print(f"wrote {out}, " + " and ".join(map(str, written)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
