"""Export a model to ONNX or TorchScript, batch dimension dynamic, and describe how to feed it.

    export(model, "onnx", "vit.onnx", img_size=32)     # the graph: (B, C, S, S) float32 -> (B, num_classes) logits
    sidecar(hparams)                                  # img_size, mean, std, class_names, the preprocessing steps

The command is vit/commands/export.py (`vit-export`).
"""

from pathlib import Path

import torch

from vit.data.images import preprocess_spec


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


def sidecar(hparams: dict) -> dict:
    """What `<out>.json` holds beside an exported model: the input's name and shape, the preprocessing facts under the
    names the README uses (img_size, in_chans, mean, std, class_names), and every step from an image file to the
    input tensor (vit.data.images.preprocess_spec), so that a runtime without this toolkit gives vit-predict's
    answers."""
    img_size, in_chans = hparams["img_size"], hparams.get("in_chans", 3)
    return {
        "input": "images",
        "output": "logits",
        "shape": ["B", in_chans, img_size, img_size],
        "img_size": img_size,
        "in_chans": in_chans,
        "mean": list(hparams["mean"]),
        "std": list(hparams["std"]),
        "class_names": hparams.get("class_names"),
        "preprocess": preprocess_spec(img_size, in_chans, hparams["mean"], hparams["std"]),
        # calibrated probabilities, as vit-predict serves them: softmax(logits / temperature) (1.0: not calibrated)
        "temperature": hparams.get("temperature", 1.0),
    }
