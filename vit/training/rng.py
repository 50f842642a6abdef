"""Every random stream a training step draws from (torch, numpy, Python, CUDA), as plain data for a checkpoint:
resuming continues the exact stream (dropout, drop-path, Mixup), and the file still loads with weights_only=True."""

import random

import numpy as np
import torch


def rng_states() -> dict:
    """The generators' states as tensors, lists and ints."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, state, gauss = random.getstate()
    states = {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "python": [version, list(state), gauss],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # dropout, DropPath, PatchDropout on a GPU
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: dict) -> None:
    """Set the generators to rng_states()'s record (CUDA's only on a machine with as many GPUs)."""
    torch.set_rng_state(states["torch"])
    kind, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, state, gauss = states["python"]
    random.setstate((version, tuple(state), gauss))
    cuda = states.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
