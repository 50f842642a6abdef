"""Saying "unknown": post-hoc scores of how much an image looks like the training data, one forward pass each.

    feats, logits, targets, inputs = features_of(model, batches, device)   # pooled features, logits, pixel statistics
    record = rejection_record(train_outputs, val_outputs, class_names)    # what fit stores: statistics, thresholds
    unknown = Rejector(record)(logits, feats, input_statistics(x))        # (B,) bool: below its class's threshold
    s = record_scores(record, logits, feats, inputs)   # {name: (B,)} each candidate, higher = more like training
    auroc(s_in, s_out), fpr_at_tpr(s_in, s_out)        # how well a score tells them apart (ood_metrics.py)

The candidates are OpenOOD v1.5's one-pass post-hoc family: the maximum softmax probability (Hendrycks & Gimpel
2017), the maximum logit (Hendrycks et al. 2022), the energy (Liu et al. 2020), the Mahalanobis distance to the
nearest class mean under a shared covariance of the pooled features (Lee et al. 2018), its relative form that
subtracts the distance to the whole training set's Gaussian (Ren et al. 2021), the same distance on L2-normalised
features (Mahalanobis++, Mueller & Hein 2025: the features' norms vary with the image more than with the class, which
breaks the shared-covariance Gaussian), the same distance to the nearest class mean in the pooled tokens after every
block, each standardised on the validation images and summed (Lee et al.'s feature ensemble, without the weights they
fitted on unknown images, which a fit does not have), the distance to the K-th nearest training feature after L2
normalisation (Sun et al. 2022), the distance of five statistics of the pixels to the training images' (`input`),
and the class-conditional Gaussians' (each class its own covariance: `qda` on the head's features, `block_qda` the
blocks' sum); and sums of them ("a+b+c"), each part standardised on the validation images. Thresholds are split
conformal on the validation images, one per predicted class where a class has enough of them. Which score a checkpoint
applies was chosen by leaving one kind of outlier out (docs/evaluation.md, "Unknown images"); the statistics every
candidate needs are kept, so vit-eval --ood compares them.
"""

import math

import torch
import torch.nn.functional as F

from vit.evaluation.image_features import as_layers, input_statistics, pooled_features

SCORES = (
    "msp",
    "max_logit",
    "energy",
    "mahalanobis",
    "relative_mahalanobis",
    "normalized_mahalanobis",
    "block_mahalanobis",
    "knn",
    "input",
    "qda",
    "block_qda",
)
FEATURE_SCORES = (
    "mahalanobis",
    "relative_mahalanobis",
    "normalized_mahalanobis",
    "block_mahalanobis",
    "knn",
    "qda",
    "block_qda",
)
# KNN: the K-th neighbour among a bank of at most BANK training features (Sun et al. use K=50 on CIFAR-10's 50,000
# images; a bank of 2,000 keeps a 384-wide checkpoint 3 MB larger); a smaller bank scales K down with it.
BANK, KNN_K = 2000, 50
# The share of in-distribution (validation) images the threshold accepts: the convention of FPR@95%TPR.
ACCEPT = 0.95
# The score a checkpoint applies (docs/evaluation.md, "Unknown images": chosen by leaving one kind of outlier out, over
# 10 kinds and models of clothing, digits and solar cells): three standardised scores summed, the blocks' and the
# head's distances under each class's own covariance, and the input statistics (blurred, low-resolution, constant,
# cropped images, which every feature score alone let through at AUROC 0.60-0.84).
DEFAULT_SCORE = "block_qda+input+qda"
# Each class's covariance costs (L + 1) x C x D x D floats in the record: above this many (192 wide x 6 blocks x 10
# classes) only the shared one is kept, and the record applies the same three parts under it (the earlier default).
CLASS_COVARIANCE_FLOATS, SHARED_DEFAULT_SCORE = 2**21, "block_mahalanobis+input+mahalanobis"
# A class with no more images than this per dimension takes the shared covariance (the measured models: 3.8-28).
MIN_IMAGES_PER_DIM = 2


# Directions whose variance is below this share of the largest are left out of the inverse: the pooled features of a
# LayerNorm-ed model lie in a subspace (a digits model's smallest eigenvalue measured 1e-14 against 0.75), and
# inverting that direction gave precisions of 1e12 and AUROC 0.50 (chance) where the same model otherwise scores 0.95.
RCOND = 1e-6


def precision_matrix(centred: torch.Tensor) -> torch.Tensor:
    """The pseudo-inverse of the covariance of centred features (N, D): (D, D), computed in float64."""
    cov = centred.double().T @ centred.double() / max(1, len(centred))
    return torch.linalg.pinv(cov, hermitian=True, rtol=RCOND).float()


def feature_stats(
    feats: torch.Tensor, targets: torch.Tensor, num_classes: int, seed: int = 0, inputs: torch.Tensor | None = None
) -> dict:
    """What the feature scores need, from the training images' pooled features (N, L + 1, D) and classes (N,): of the
    head's features, class means (C, D) and their shared precision (D, D), the whole set's mean (D,) and precision,
    the class means and precision of the L2-normalised features, a bank of at most BANK L2-normalised features (K, D);
    of each block's, class means (L, C, D) and precisions (L, D, D); of their input_statistics (N, 5), where given,
    the mean (5,) and precision (5, 5). A class without images gets the overall mean.
    The blocks' distances still need their scale on validation images: block_scale."""
    blocks, feats = as_layers(feats.float())[:, :-1], as_layers(feats.float())[:, -1]
    normed = F.normalize(feats, dim=-1)
    means, overall = _class_means(feats, targets, num_classes)
    normed_means, _ = _class_means(normed, targets, num_classes)
    pick = torch.randperm(len(feats), generator=torch.Generator().manual_seed(seed))[:BANK]
    stats = {
        "means": means,
        "precision": precision_matrix(feats - means[targets]),
        "background_mean": overall,
        "background_precision": precision_matrix(feats - overall),
        "normalized_means": normed_means,
        "normalized_precision": precision_matrix(normed - normed_means[targets]),
        "bank": normed[pick],
    }
    if inputs is not None:
        stats["input_mean"] = inputs.float().mean(0)
        stats["input_precision"] = precision_matrix(inputs.float() - stats["input_mean"])
    if blocks.shape[1]:
        block_means = [_class_means(blocks[:, i], targets, num_classes)[0] for i in range(blocks.shape[1])]
        stats["block_means"] = torch.stack(block_means)  # (L, C, D)
        stats["block_precision"] = torch.stack(
            [precision_matrix(blocks[:, i] - m[targets]) for i, m in enumerate(block_means)]
        )
    layers = torch.cat([blocks, feats[:, None]], dim=1)  # (N, L + 1, D)
    if layers.shape[1] * num_classes * layers.shape[-1] ** 2 <= CLASS_COVARIANCE_FLOATS:
        stats["class_precision"], stats["class_logdet"] = _class_gaussians(layers, targets, num_classes)
    return stats


def _class_gaussians(feats: torch.Tensor, targets: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, L + 1, D) training features -> each layer's and class's precision (L + 1, C, D, D) and log-determinant
    (L + 1, C) of its own covariance (too few images: the shared one), on the directions above RCOND, in float64."""
    precisions, logdets = [], []
    for i in range(feats.shape[1]):
        x = feats[:, i].double()
        means, _ = _class_means(x, targets, num_classes)
        centred = x - means[targets]
        covs = [centred.T @ centred / max(1, len(x))]  # the shared covariance first
        for c in range(num_classes):
            z = centred[targets == c]
            covs.append(z.T @ z / len(z) if len(z) > MIN_IMAGES_PER_DIM * x.shape[1] else covs[0])
        w, v = torch.linalg.eigh(torch.stack(covs[1:]))  # (C, D), (C, D, D)
        kept = w > RCOND * w.amax(-1, keepdim=True)
        inverse = torch.where(kept, 1 / w.clamp_min(1e-300), 0.0)
        precisions.append((v * inverse[:, None]) @ v.transpose(-1, -2))
        logdets.append(torch.where(kept, w.clamp_min(1e-300).log(), 0.0).sum(-1))
    return torch.stack(precisions).float(), torch.stack(logdets).float()


def _block_distances(feats: torch.Tensor, stats: dict) -> torch.Tensor:
    """(N, L + 1, D) pooled features -> (N, L) squared Mahalanobis distance to the nearest class mean in each block."""
    blocks = as_layers(feats.float())[:, :-1]
    return torch.stack(
        [
            squared_distances(blocks[:, i], m, p).amin(-1)
            for i, (m, p) in enumerate(zip(stats["block_means"], stats["block_precision"]))
        ],
        dim=-1,
    )


def block_scale(stats: dict, val_feats: torch.Tensor) -> dict:
    """The blocks' distances' and every layer's class-covariance distances' mean and spread on validation images
    (N, L + 1, D), which put them on one scale before they are summed (the training images are fitted); `stats` with."""
    out = dict(stats)
    if "block_means" in stats:
        d = _block_distances(val_feats, stats)
        out.update(block_center=d.mean(0), block_spread=d.std(0).clamp_min(1e-12))
    if "class_precision" in stats:
        d = _qda_distances(val_feats, stats)
        out.update(qda_center=d.mean(0), qda_spread=d.std(0).clamp_min(1e-12))
    return out


def _qda_distances(feats: torch.Tensor, stats: dict) -> torch.Tensor:
    """(N, L + 1, D) pooled features -> (N, L + 1): each layer's smallest over the classes of the squared distance
    under the class's own covariance plus its log-determinant (minus twice the log-density, up to a constant)."""
    means = stats["means"][None]  # (L + 1, C, D): the blocks' class means, then the head's
    means = torch.cat([stats["block_means"], means]) if "block_means" in stats else means
    out, step = [], max(1, 2**22 // means.numel())  # rows a chunk: ~32 MB of float64 differences, whatever C and D
    for f in as_layers(feats.float()).split(step):  # (n, L + 1, D)
        z = f.double()[:, :, None] - means.double()[None]  # (n, L + 1, C, D)
        d = torch.einsum("nlcd,lcde,nlce->nlc", z, stats["class_precision"].double(), z)
        out.append((d + stats["class_logdet"].double()).amin(-1))
    return torch.cat(out).float()


def _class_means(feats: torch.Tensor, targets: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(C, D) class means of (N, D) features, a class without images taking the overall mean (D,); both."""
    overall = feats.mean(0)
    present = [(targets == c).any() for c in range(num_classes)]
    return torch.stack([feats[targets == c].mean(0) if present[c] else overall for c in range(num_classes)]), overall


def squared_distances(feats: torch.Tensor, means: torch.Tensor, precision: torch.Tensor) -> torch.Tensor:
    """(N, D) features, (M, D) means -> (N, M) squared Mahalanobis distances under one precision (float64: the
    expanded quadratic form subtracts large terms)."""
    feats, means, precision = feats.double(), means.double(), precision.double()
    fp = feats @ precision
    d = (fp * feats).sum(-1, keepdim=True) - 2 * fp @ means.T + ((means @ precision) * means).sum(-1)[None]
    return d.float()


def unknown_scores(
    logits: torch.Tensor,
    feats: torch.Tensor | None,
    stats: dict | None,
    names=SCORES,
    inputs: torch.Tensor | None = None,
) -> dict:
    """{score name: (N,)}, higher meaning more like the training data, for each of `names` that the inputs allow
    (the feature scores need `feats` and `stats`; "input" the images' input_statistics (N, 5) and `stats`)."""
    logits = logits.float()
    out = {}
    if "input" in names and inputs is not None and "input_mean" in (stats or {}):
        d = inputs.float().cpu() - stats["input_mean"]
        out["input"] = -squared_distances(d, torch.zeros_like(d[:1]), stats["input_precision"])[:, 0]
    if "msp" in names:
        out["msp"] = logits.softmax(-1).amax(-1)
    if "max_logit" in names:
        out["max_logit"] = logits.amax(-1)
    if "energy" in names:
        out["energy"] = torch.logsumexp(logits, -1)  # minus the free energy at temperature 1
    if feats is None or not stats:
        return out
    if "block_mahalanobis" in names and "block_center" in stats and as_layers(feats).shape[1] > 1:
        z = (_block_distances(feats, stats) - stats["block_center"]) / stats["block_spread"]  # (N, L)
        out["block_mahalanobis"] = -z.sum(-1)
    if {"qda", "block_qda"} & set(names) and "qda_center" in stats:
        z = (_qda_distances(feats, stats) - stats["qda_center"]) / stats["qda_spread"]  # (N, L + 1)
        if "qda" in names:
            out["qda"] = -z[:, -1]
        if "block_qda" in names and z.shape[1] > 1:
            out["block_qda"] = -z[:, :-1].sum(-1)
    feats = as_layers(feats.float())[:, -1]  # the head's features
    if {"mahalanobis", "relative_mahalanobis"} & set(names):
        d = squared_distances(feats, stats["means"], stats["precision"])  # (N, C)
        if "mahalanobis" in names:
            out["mahalanobis"] = -d.amin(-1)
        if "relative_mahalanobis" in names:
            bg = squared_distances(feats, stats["background_mean"][None], stats["background_precision"])  # (N, 1)
            out["relative_mahalanobis"] = -(d - bg).amin(-1)
    if "normalized_mahalanobis" in names and "normalized_means" in stats:  # a record made before it lacks them
        d = squared_distances(F.normalize(feats, dim=-1), stats["normalized_means"], stats["normalized_precision"])
        out["normalized_mahalanobis"] = -d.amin(-1)
    if "knn" in names:
        bank = stats["bank"]
        k = max(1, round(KNN_K * len(bank) / BANK))
        sims = torch.cat([F.normalize(f, dim=-1) @ bank.T for f in feats.split(4096)])  # (N, K_bank)
        out["knn"] = sims.topk(k, dim=-1).values[:, -1]  # cosine similarity of the K-th neighbour
    return out


def fusion_of(scores: dict, name: str) -> dict:
    """What a fused score `name` ("a+b", each part a score of SCORES) needs: each part's mean and spread on these
    (validation) scores, which put the parts on one scale before they are summed."""
    parts = name.split("+")
    return {
        "center": [float(scores[p].mean()) for p in parts],
        "spread": [float(scores[p].std().clamp_min(1e-12)) for p in parts],
    }


def record_scores(
    record: dict | None, logits: torch.Tensor, feats: torch.Tensor | None, inputs: torch.Tensor | None, names=SCORES
) -> dict:
    """unknown_scores with a record's statistics, and the record's own score too: a fused one ("a+b") is the sum of
    its parts, each standardised by the record's `fusion` (fusion_of)."""
    stats = (record or {}).get("stats")
    parts = record["score"].split("+") if record else []
    out = unknown_scores(logits, feats, stats, tuple(names) + tuple(parts), inputs)
    if len(parts) > 1 and all(p in out for p in parts):
        out[record["score"]] = fused_score(out, record["score"], record["fusion"])
    return out


def fused_score(scores: dict, name: str, fusion: dict) -> torch.Tensor:
    """The fused score `name` ("a+b") from its parts' scores: each standardised by `fusion` (fusion_of), summed."""
    parts = name.split("+")
    return sum((scores[p] - c) / d for p, c, d in zip(parts, fusion["center"], fusion["spread"]))


def score_statistics(record: dict | None) -> dict[str, torch.Tensor]:
    """The statistics the rejection record's score needs (float32 tensors): what an export keeps beside its sidecar
    (`<out>.unknown.safetensors`; a class-covariance score's are ~15 MB as JSON text, ~4 MB as float32)."""
    if record is None:
        return {}
    needs = {
        "mahalanobis": ("means", "precision"),
        "knn": ("bank",),
        "relative_mahalanobis": ("means", "precision", "background_mean", "background_precision"),
        "normalized_mahalanobis": ("normalized_means", "normalized_precision"),
        "block_mahalanobis": ("block_means", "block_precision", "block_center", "block_spread"),
        "input": ("input_mean", "input_precision"),
        **dict.fromkeys(
            ("qda", "block_qda"),
            ("means", "block_means", "class_precision", "class_logdet", "qda_center", "qda_spread"),
        ),
    }
    keys = [k for part in record["score"].split("+") for k in needs.get(part, ()) if k in record["stats"]]
    return {k: record["stats"][k].float().contiguous() for k in keys}


def rejection_record(train: tuple | None, val: tuple, class_names: list[str]) -> dict:
    """A model's rejection record from features_of's outputs (pooled features, logits, targets, input statistics) on
    its training images (None: a stream, whose statistics are not gathered: the logits' energy) and on its validation
    images: the statistics from the training images, every score's threshold and the default's per-class ones from the
    validation images, so that at most 1 - ACCEPT of new images like them is rejected (never from the training ones,
    which the model has fitted); vit-predict, vit-serve, vit-eval and the ONNX sidecar apply the DEFAULT_SCORE's."""
    stats = None
    if train is not None:
        feats, _, targets, inputs = train
        stats = feature_stats(feats, targets, len(class_names), inputs=inputs)
    feats, logits, _, inputs = val
    if stats is not None:
        stats = block_scale(stats, feats)
    scores = unknown_scores(logits, feats, stats, inputs=inputs)
    # the default where its statistics exist, else the same parts under the shared covariance, else the logits'
    score = next((c for c in (DEFAULT_SCORE, SHARED_DEFAULT_SCORE) if all(p in scores for p in c.split("+"))), "energy")
    parts = score.split("+")
    record = {"score": score, "accept": ACCEPT, "stats": stats or {}}
    if len(parts) > 1:
        record["fusion"] = fusion_of(scores, score)
        scores[score] = fused_score(scores, score, record["fusion"])  # its parts are already scored
    thresholds = {name: reject_threshold(s) for name, s in scores.items()}
    per_class = class_thresholds(scores[score], logits.argmax(-1), len(class_names))
    return {
        **record,
        "threshold": thresholds[score],
        "thresholds": thresholds,
        "class_thresholds": per_class,
        # the classes predicted for fewer than MIN_CLASS_IMAGES validation images: they keep the shared threshold
        "shared_threshold_classes": [class_names[c] for c, t in enumerate(per_class) if t is None],
    }


def accept_threshold(scores: torch.Tensor, accept: float = ACCEPT) -> float:
    """The score above which `accept` of these (in-distribution) images lie (FPR at 95% TPR's convention)."""
    return float(torch.quantile(scores.double(), 1 - accept))


def reject_threshold(scores: torch.Tensor, accept: float = ACCEPT) -> float:
    """The threshold a checkpoint stores, from its n validation scores: the k-th lowest, k = floor((1 - accept)(n + 1))
    (split conformal: a new image like them falls below it with probability k / (n + 1) <= 1 - accept). The plain
    quantile rejects 1 - accept of the validation images themselves, and more of new ones half the time: on the cells'
    held-out folds (295 validation images) 4.3-5.7%."""
    ordered = scores.double().sort().values
    k = max(1, math.floor((1 - accept) * (len(ordered) + 1)))  # under 19 images: only what is below them all
    return float(ordered[k - 1])


# A class gets its own threshold from at least this many validation images predicted as it (k = 2 of them below it
# at 95%); a class with fewer keeps the shared threshold, and the record lists it.
MIN_CLASS_IMAGES = 50


def class_thresholds(
    scores: torch.Tensor, predicted: torch.Tensor, num_classes: int, accept: float = ACCEPT
) -> list[float | None]:
    """Per-class thresholds (C,) from validation scores (N,) and predicted classes (N,): each the split-conformal
    threshold (reject_threshold) of the images predicted as that class, so that a new image of a class is rejected
    with probability at most 1 - accept whichever class it is, not only on average over the classes (Mondrian
    conformal, grouped by the prediction: the only class known when an image arrives). None where fewer than
    MIN_CLASS_IMAGES images were predicted as the class: it keeps the shared threshold."""
    return [
        reject_threshold(scores[predicted == c], accept) if int((predicted == c).sum()) >= MIN_CLASS_IMAGES else None
        for c in range(num_classes)
    ]


def thresholds_of(record: dict, logits: torch.Tensor) -> torch.Tensor:
    """(B,) the threshold that applies to each image: its predicted class's own where the record has one (records
    made before per-class thresholds have none: the shared one for every image)."""
    shared = record["threshold"]
    table = torch.tensor(
        [shared if t is None else t for t in record.get("class_thresholds") or []] or [shared], dtype=torch.float64
    )
    if len(table) == 1:
        return table.expand(len(logits))
    return table[logits.argmax(-1).cpu()]


class Rejector:
    """A checkpoint's rejection (its "unknown" record, vit.model.checkpoint.unknown_of; None: never unknown):
    `rejector(logits, feats, input_statistics(x))` -> (B,) bool, True where the image scores below the threshold of
    its predicted class."""

    def __init__(self, record: dict | None):
        self.record = record
        self.score = record["score"] if record else None
        self.needs_features = any(p in FEATURE_SCORES for p in (self.score or "").split("+"))
        self.needs_inputs = "input" in (self.score or "").split("+")

    def inputs(self, x: torch.Tensor) -> torch.Tensor | None:
        """The images' input_statistics where the score reads them (None otherwise: nothing computed)."""
        return input_statistics(x) if self.needs_inputs else None

    def forward(self, model, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits, pooled features or None) of one forward: the features only where the score needs them."""
        if self.needs_features:
            feats, logits = pooled_features(model, x)
            return logits, feats
        return model(x), None

    def __call__(self, logits: torch.Tensor, feats: torch.Tensor | None, inputs: torch.Tensor | None) -> torch.Tensor:
        if self.record is None:
            return torch.zeros(len(logits), dtype=torch.bool)
        feats = feats.cpu() if feats is not None else None
        s = record_scores(self.record, logits.cpu(), feats, inputs, names=())[self.score]
        return s < thresholds_of(self.record, logits)
