"""Export a model to ONNX or TorchScript, batch dimension dynamic, and describe how to feed it; or back to timm.

    export(model, "onnx", "vit.onnx", img_size=32)     # the graph: (B, C, S, S) float32 -> logits, pooled features
    quantize_int8("vit.onnx", "vit-int8.onnx")         # its matrix products in int8, for CPUs
    write_sidecar("vit.onnx", record)                  # vit.onnx.json: img_size, mean, std, class_names, the
                                                       # preprocessing steps; vit.onnx.unknown.safetensors: rejection
    export_timm(model, record, "vit_timm/")           # model.safetensors + config.json, timm's Hugging Face layout

The command is vit/commands/export.py (`vit-export`).
"""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from vit.data.images import preprocess_spec
from vit.evaluation.image_features import pooled_features
from vit.evaluation.unknown import score_statistics
from vit.model.interop import timm_args, to_timm
from vit.model.record import CheckpointRecord


class LogitsAndFeatures(torch.nn.Module):
    """The exported graph's two outputs: the logits (B, num_classes) and the pooled features (B, L + 1, D): after
    each block, then the head's; the unknown scores of vit/evaluation/unknown.py need them (their statistics are in
    the sidecar)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        feats, logits = pooled_features(self.model, x)
        return logits, feats


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
            LogitsAndFeatures(model).eval(),
            (example,),
            dynamo=True,
            input_names=["images"],
            output_names=["logits", "features"],
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


def quantize_int8(fp32: str | Path, out: str | Path, op_types: tuple[str, ...] | None = ("MatMul", "Gemm")) -> Path:
    """ONNX Runtime's dynamic quantization of an exported model: the weights of every MatMul and Gemm in int8, the
    activations quantized per batch at run time. Dynamic, not static: a ViT's activations (after softmax and GELU,
    the residual stream's outliers) vary from image to image, so ranges fixed on calibration images cost accuracy,
    and dynamic needs no data. Convolutions stay float (`op_types`; None quantizes every type ONNX Runtime can): its
    ConvInteger has no fast kernel, and a hybrid's EfficientNet stages in int8 ran at 0.13x fp32 ONNX's images/s,
    where the products alone give 1.14x; the CIFAR-size ViT, 1.54x with its patch convolution float and 1.44x in int8.
    bench/int8.py measures both against fp32 ONNX and torch (docs/performance.md)."""
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    logging.getLogger().setLevel(logging.ERROR)  # its "consider pre-processing" advice is printed through root
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    types = list(op_types) if op_types is not None else None  # None: every type ONNX Runtime quantizes
    quantize_dynamic(str(fp32), str(out), weight_type=QuantType.QInt8, op_types_to_quantize=types)
    return out


def sidecar(record: CheckpointRecord, stats_file: str | None = None) -> dict:
    """What `<out>.json` holds beside an exported model: the input's name and shape, the preprocessing facts under the
    names the README uses (img_size, in_chans, mean, std, class_names), and every step from an image file to the
    input tensor (vit.data.images.preprocess_spec), so that a runtime without this toolkit gives vit-predict's
    answers."""
    img_size, in_chans = record.img_size, record.in_chans
    return {
        "input": "images",
        "output": "logits",
        "shape": ["B", in_chans, img_size, img_size],
        "img_size": img_size,
        "in_chans": in_chans,
        "mean": list(record.mean),
        "std": list(record.std),
        "class_names": list(record.class_names),
        "preprocess": preprocess_spec(img_size, in_chans, list(record.mean), list(record.std)),
        # calibrated probabilities, as vit-predict serves them: softmax(logits / temperature) (1.0: not calibrated)
        "temperature": record.temperature,
        # rejection: the score (of `logits` and `features`), its threshold; its statistics in `stats_file`; null: none
        "unknown": {**record.rejection(), "stats_file": stats_file} if record.unknown is not None else None,
        # "multilabel": `logits` are one sigmoid per label, each label given at or above its threshold (a list)
        "task": record.task,
        "thresholds": record.thresholds,
    }


def write_sidecar(out: str | Path, record: CheckpointRecord, **extra) -> list[Path]:
    """`<out>.json` (sidecar(record) and `extra`) and, when the rejection record has statistics,
    `<out>.unknown.safetensors` beside it: the files written."""
    out = Path(out)
    stats = score_statistics(record.unknown)
    written = []
    if stats:
        written.append(out.with_name(f"{out.name}.unknown.safetensors"))
        save_file(stats, str(written[-1]))
    meta = {**sidecar(record, stats_file=written[0].name if written else None), **extra}
    Path(f"{out}.json").write_text(json.dumps(meta, indent=2) + "\n")
    return [Path(f"{out}.json"), *written]


def export_timm(model: torch.nn.Module, record: CheckpointRecord, out: str | Path) -> Path:
    """A folder in timm's Hugging Face layout: `model.safetensors` (timm's keys) and `config.json`, whose
    `model_args` rebuild the model (`timm.models.VisionTransformer(**model_args)`) and whose `pretrained_cfg` holds
    the preprocessing (`timm.data.resolve_data_config` reads it). `--model.init_from FOLDER` reads it back."""
    from safetensors.torch import save_file

    out = Path(out)
    args = timm_args(model)  # refuses variants that timm does not have, before anything is written
    out.mkdir(parents=True, exist_ok=True)
    sd = {k: v.contiguous() for k, v in to_timm(model).state_dict().items()}
    save_file(sd, out / "model.safetensors")
    config = {
        "architecture": "vit_from_vit_toolkit",  # no timm registry name fits a custom size: build from model_args
        "num_classes": args["num_classes"],
        "num_features": args["embed_dim"],
        "global_pool": args["global_pool"],
        "model_args": args,
        "label_names": list(record.class_names),
        "pretrained_cfg": {
            "input_size": [args["in_chans"], args["img_size"], args["img_size"]],
            "interpolation": "bilinear",
            "crop_pct": 1.0,  # shorter side resized to img_size, then a centre crop of img_size
            "mean": list(record.mean),
            "std": list(record.std),
            "num_classes": args["num_classes"],
        },
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out
