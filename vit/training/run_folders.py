"""Where a run's files go, in one place: checkpoints/<run>/version_<n>/ beside logs/<run>/version_<n>/, both under
--trainer.default_root_dir when given; the files that belong beside the logs (plan.yaml, label_issues.csv, split.csv)
go there, or with no logger beside the checkpoints; `--ckpt_path last` finds the newest last*.ckpt of the run's name,
and a resumed run continues in its checkpoint's version_<n>."""

import re
from pathlib import Path


def checkpoint_folder(root: str | Path, logger) -> Path:
    """checkpoints/<run>/version_<n>/ of a logger (its name and version); without a logger a version of its own
    (checkpoints/default/version_<n>), so that a second run never overwrites the first one's files."""
    if logger:
        return Path(root) / "checkpoints" / logger.name / f"version_{logger.version}"
    return next_free_version(Path(root) / "checkpoints" / "default")


def run_files_folder(logger, checkpoint_callbacks: list) -> Path | None:
    """Where a run's own files go: beside the logs; with no logger beside the (first) checkpoints; None with neither."""
    if logger:
        return Path(logger.log_dir)
    dirpath = getattr((checkpoint_callbacks or [None])[0], "dirpath", None)
    return Path(dirpath) if dirpath else None


def newest_last_checkpoint(root: str | Path, name: str) -> tuple[Path | None, Path]:
    """(the newest last*.ckpt under root/checkpoints/<name>/version_*/ or None, the folder searched)."""
    runs = Path(root, "checkpoints", name)
    found = sorted(runs.glob("version_*/last*.ckpt"), key=lambda p: p.stat().st_mtime)
    return (found[-1] if found else None), runs


def version_of(ckpt: str | Path, name: str) -> int | None:
    """n for a checkpoint in checkpoints/<name>/version_<n>/ (a run to continue in place), else None."""
    match = re.fullmatch(r"version_(\d+)", Path(ckpt).parent.name)
    return int(match.group(1)) if match and Path(ckpt).parent.parent.name == name else None


def next_free_version(folder: Path) -> Path:
    """folder/version_<n> for the first n after every existing version_* there."""
    taken = [int(m.group(1)) for p in folder.glob("version_*") if (m := re.fullmatch(r"version_(\d+)", p.name))]
    return folder / f"version_{max(taken, default=-1) + 1}"
