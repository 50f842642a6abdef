"""What a run writes into its checkpoints besides the model: the data config it trained on."""

import lightning as L


class DataRecord(L.Callback):
    """Writes the data config of the run into every checkpoint, under the key `data` ({"class_path", "init_args"},
    plain values, local paths made absolute): `vit-eval --split val` rebuilds the validation split exactly as
    training saw it from the file alone."""

    def __init__(self, data: dict):
        self.data = data

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        checkpoint["data"] = self.data


def plain_data_config(data, cwd=None) -> dict | None:
    """A LightningCLI `data` entry (jsonargparse Namespace or dict) -> {"class_path", "init_args"} of plain values,
    with `root`-like fields that name an existing local path resolved against `cwd` (default: the working folder)."""
    import os
    from pathlib import Path

    if data is None:
        return None
    data = data.as_dict() if hasattr(data, "as_dict") else dict(data)
    args = dict(data.get("init_args") or {})
    for key in ("root", "input_dir", "labels"):
        value = args.get(key)
        if isinstance(value, str) and "://" not in value and Path(cwd or os.getcwd(), value).exists():
            args[key] = str(Path(cwd or os.getcwd(), value).resolve())
    plain = {k: list(v) if isinstance(v, tuple) else v for k, v in args.items()}
    return {"class_path": data.get("class_path"), "init_args": plain}
