"""Is a near kind separable anywhere in a model? Per block and score family, the AUROC of a checkpoint's test images
against a folder of held-out-class images, with the training features recomputed (no record needed):

    python bench/experiments/near_by_layer.py CKPT TEST_DIR NEAR_DIR

Prints, for each block's pooled tokens and the head's features: the Mahalanobis distance to the nearest class mean
(shared covariance), and the cosine similarity of the 1st and 50th nearest training feature (KNN, Sun et al. 2022);
then two logit / subspace scores that unknown.py does not have: GEN (Liu et al. 2023, gamma 0.1) and ViM's residual
(Wang et al. 2022: the norm of the head's feature off the training features' top principal directions); and which
classes the near images are predicted as.
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from vit.data.images import expand_inputs
from vit.deployment.labelled import labelled_folder, training_data
from vit.evaluation.ood_metrics import auroc
from vit.evaluation.unknown import precision_matrix, squared_distances
from vit.model.checkpoint import load_checkpoint, model_of

sys.path.insert(0, str(Path(__file__).parent))
from ood_protocol import outputs_of  # noqa: E402


def gen(logits: torch.Tensor, gamma: float = 0.1) -> torch.Tensor:
    """GEN's score (higher = more like training): minus the generalised entropy of the softmax."""
    p = logits.float().softmax(-1)
    return -(p**gamma * (1 - p) ** gamma).sum(-1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt")
    ap.add_argument("test")
    ap.add_argument("near")
    ap.add_argument("--limit", type=int, default=2000)
    a = ap.parse_args()
    ckpt = load_checkpoint(a.ckpt)
    model, hp = model_of(ckpt, a.ckpt)
    classes = hp.class_names
    files, labels = zip(*training_data(a.ckpt, ckpt, hp).samples["train"])
    train, y = outputs_of(model, hp, list(files)), torch.tensor(labels)
    test = outputs_of(model, hp, labelled_folder(Path(a.test), classes)[0])
    near = outputs_of(model, hp, expand_inputs([a.near])[: a.limit])
    for layer in range(train[0].shape[1]):  # (N, L + 1, D): the blocks', then the head's features
        xt, xi, xo = (o[0][:, layer] for o in (train, test, near))
        means = torch.stack([xt[y == c].mean(0) for c in range(len(classes))])
        precision = precision_matrix(xt - means[y])
        bank = F.normalize(xt, dim=-1)

        def maha(x: torch.Tensor, means=means, precision=precision) -> torch.Tensor:
            return -squared_distances(x, means, precision).amin(-1)

        def knn(x: torch.Tensor, k: int, bank=bank) -> torch.Tensor:
            return (F.normalize(x, dim=-1) @ bank.T).topk(k, -1).values[:, -1]

        name = "head" if layer == train[0].shape[1] - 1 else f"block {layer}"
        print(f"{name:8s} mahalanobis {auroc(maha(xi), maha(xo)):.3f}  knn1 {auroc(knn(xi, 1), knn(xo, 1)):.3f}  "
              f"knn50 {auroc(knn(xi, 50), knn(xo, 50)):.3f}")  # fmt: skip
    head = train[0][:, -1].double()
    centre = head.mean(0)
    _, vectors = torch.linalg.eigh((head - centre).T @ (head - centre) / len(head))  # ascending variance
    for kept in (head.shape[1] // 4, head.shape[1] // 2):
        off = vectors[:, : head.shape[1] - kept]  # the least-varying directions

        def residual(feats: torch.Tensor, off=off) -> torch.Tensor:
            return -((feats[:, -1].double() - centre) @ off).norm(dim=-1)

        print(f"ViM residual off the top {kept} directions: {auroc(residual(test[0]), residual(near[0])):.3f}")
    print(f"GEN: {auroc(gen(test[1]), gen(near[1])):.3f}")
    counts = torch.bincount(near[1].argmax(-1), minlength=len(classes)).tolist()
    print("near images predicted as: " + ", ".join(f"{c} {n}" for c, n in zip(classes, counts)))


if __name__ == "__main__":
    main()
