"""An exported ONNX model (`vit-export --format onnx [--quantize int8]`) run by ONNX Runtime, in place of the torch
model: `vit-predict --onnx FILE` classifies with it, with the preprocessing and calibration of its sidecar.

    model, record = load_onnx("vit-int8.onnx")    # record from vit-int8.onnx.json: record.img_size, mean, std, ...
    logits = model(normalized_batch)               # (B, C, S, S) float32 -> (B, num_classes), as the torch model
"""

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from vit.model.record import CheckpointRecord, sidecar_record


class OnnxClassifier(torch.nn.Module):
    """Called like vit.model.VisionTransformer: a normalised (B, C, S, S) float32 batch in, logits out (on the CPU:
    ONNX Runtime's CPU provider, which is what int8 is for)."""

    def __init__(self, path: str | Path, threads: int | None = None):
        super().__init__()
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.input = self.session.get_inputs()[0].name
        self.num_classes = int(self.session.get_outputs()[0].shape[-1])
        self.has_features = len(self.session.get_outputs()) > 1  # exports before rejection have logits only

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.session.run(None, {self.input: x.float().cpu().numpy()})[0])

    def features_and_logits(self, x: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(pooled features or None, logits) of one run: what vit.evaluation.image_features.pooled_features asks."""
        out = self.session.run(None, {self.input: x.float().cpu().numpy()})
        return (torch.from_numpy(out[1]) if self.has_features else None), torch.from_numpy(out[0])


class OnnxError(ValueError):
    """An ONNX file or its sidecar that cannot be used; the message names the file."""


def load_onnx(path: str | Path, threads: int | None = None) -> tuple[OnnxClassifier, CheckpointRecord]:
    """The model (run on `threads` intra-op threads; None: ONNX Runtime's default) and the record predict needs
    (img_size, in_chans, mean, std, class_names, temperature, ...; vit/model/record.py), read from `<path>.json`,
    which vit-export writes beside the model."""
    path = Path(path)
    meta = Path(f"{path}.json")
    if not path.is_file():
        raise OnnxError(f"{path}: no such ONNX file")
    if not meta.is_file():
        raise OnnxError(f"{path}: no {meta.name} beside it (vit-export writes the preprocessing there)")
    try:
        spec = json.loads(meta.read_text())
        missing = [k for k in ("img_size", "mean", "std") if k not in spec]
    except (OSError, ValueError) as e:
        raise OnnxError(f"{meta}: not readable JSON ({e})") from None
    if missing:
        raise OnnxError(f"{meta}: no {', '.join(missing)}")
    try:
        model = OnnxClassifier(path, threads)
    except Exception as e:  # onnxruntime raises its own types for a broken graph
        raise OnnxError(f"{path}: ONNX Runtime cannot load it ({str(e).splitlines()[0]})") from None
    unknown = spec.get("unknown")
    if unknown is not None:
        stats = unknown_stats(path, unknown)
        if not model.has_features and stats:
            raise OnnxError(f"{path}: its sidecar rejects by {unknown['score']}, the graph has no features output")
        unknown = {**unknown, "threshold": float(unknown["threshold"]), "stats": stats}
    return model, sidecar_record(spec, model.num_classes, unknown)


def unknown_stats(path: Path, unknown: dict) -> dict[str, torch.Tensor]:
    """The rejection statistics of an export: from the safetensors file its sidecar names (`stats_file`, beside the
    model), or from the lists of an older JSON sidecar (`stats`)."""
    if "stats_file" not in unknown:  # an older export: the statistics are lists in the JSON
        return {k: torch.tensor(v, dtype=torch.float32) for k, v in (unknown.get("stats") or {}).items()}
    if unknown["stats_file"] is None:
        return {}
    file = path.parent / unknown["stats_file"]
    try:
        return load_file(str(file))
    except FileNotFoundError:
        raise OnnxError(f"{path}: no {file.name} beside it (its sidecar's rejection statistics)") from None
    except Exception as e:  # safetensors raises its own error for a cut or foreign file
        raise OnnxError(f"{file}: not a safetensors file of rejection statistics ({e})") from None
