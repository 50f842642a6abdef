"""Evaluation figures and per-class numbers from a confusion matrix (rows: true class, columns: predicted)."""

import matplotlib

matplotlib.use("Agg")  # files and TensorBoard only: no display
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402


def confusion_matrix(logits: torch.Tensor, targets: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(C, C) counts of argmax predictions, rows = true class."""
    cells = targets * num_classes + logits.argmax(-1)
    return torch.bincount(cells, minlength=num_classes * num_classes).view(num_classes, num_classes)


def per_class_recall(cm: torch.Tensor) -> torch.Tensor:
    """(C,) share of each class's images predicted as that class (0 for a class with no image)."""
    return cm.diag().double() / cm.sum(dim=1).clamp(min=1)


def confusion_figure(cm: torch.Tensor, classes: list[str]):
    """Counts and row-normalised shares side by side, class names on the axes (smaller type for many classes)."""
    n = len(classes)
    side = min(14.0, 3.0 + 0.28 * n)
    font = max(3.0, min(9.0, 260 / max(n, 1)))
    fig, axes = plt.subplots(1, 2, figsize=(2 * side + 1, side), dpi=100)
    shares = cm.double() / cm.sum(dim=1, keepdim=True).clamp(min=1)
    for ax, values, title in ((axes[0], cm, "counts"), (axes[1], shares, "share of the true class")):
        ax.imshow(values.numpy(), cmap="Blues")
        ax.set_title(title)
        ax.set_xlabel("predicted")
        ax.set_ylabel("true")
        ax.set_xticks(range(n), classes, rotation=90, fontsize=font)
        ax.set_yticks(range(n), classes, fontsize=font)
        if n <= 20:  # numbers in the cells while they stay legible
            for i in range(n):
                for j in range(n):
                    v = values[i, j].item()
                    ax.text(
                        j,
                        i,
                        f"{v:.2f}" if values.is_floating_point() else str(int(v)),
                        ha="center",
                        va="center",
                        fontsize=font,
                        color="white" if v > values.max().item() / 2 else "black",
                    )
    fig.tight_layout()
    return fig
