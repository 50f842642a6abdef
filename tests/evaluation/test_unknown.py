"""Saying "unknown" (vit/evaluation/unknown.py): the scores against references, the threshold stored after fit on the
validation set, and every output that carries it (vit-predict table/JSON/CSV, vit-eval, the ONNX sidecar); older
checkpoints never say unknown."""

import csv
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from vit.commands.eval import main as eval_main
from vit.commands.export import main as export_main
from vit.commands.predict import main as predict_main
from vit.evaluation import unknown
from vit.evaluation.image_features import pooled_features
from vit.evaluation.ood_metrics import auroc, fpr_at_tpr
from vit.evaluation.unknown import (
    ACCEPT,
    DEFAULT_SCORE,
    MIN_CLASS_IMAGES,
    SCORES,
    SHARED_DEFAULT_SCORE,
    Rejector,
    accept_threshold,
    block_scale,
    class_thresholds,
    feature_stats,
    reject_threshold,
    rejection_record,
    thresholds_of,
    unknown_scores,
)
from vit.model import VisionTransformer, ViTConfig
from vit.model.checkpoint import CheckpointError, load_checkpoint, load_model


def test_each_score_against_a_reference_and_far_points_are_told_apart():
    g = torch.Generator().manual_seed(0)
    means = torch.tensor([[3.0, 0.0, 0.0], [-3.0, 0.0, 0.0]])
    targets = torch.arange(2).repeat(500)
    feats = means[targets] + torch.randn(1000, 3, generator=g) * torch.tensor([1.0, 0.5, 2.0])
    stats = feature_stats(feats, targets, 2)
    x = torch.tensor([[1.0, 2.0, -1.0]])
    logits = torch.tensor([[2.0, 0.5]])
    s = unknown_scores(logits, x, stats)
    # Mahalanobis: the nearest class mean under the inverse of the shared (within-class) covariance
    centred = feats - stats["means"][targets]
    inv = torch.linalg.inv(centred.T @ centred / len(feats))
    d = torch.stack([(x[0] - m) @ inv @ (x[0] - m) for m in stats["means"]])
    bg = (x[0] - feats.mean(0)) @ torch.linalg.inv(torch.cov(feats.T, correction=0)) @ (x[0] - feats.mean(0))
    torch.testing.assert_close(s["mahalanobis"], -d.min()[None], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s["relative_mahalanobis"], -(d - bg).min()[None], rtol=1e-4, atol=1e-4)
    # Mahalanobis++: the same on unit-length features, with their own class means and shared covariance
    unit, x_unit = feats / feats.norm(dim=-1, keepdim=True), x[0] / x[0].norm()
    unit_means = torch.stack([unit[targets == c].mean(0) for c in range(2)])
    inv_unit = torch.linalg.inv((unit - unit_means[targets]).T @ (unit - unit_means[targets]) / len(unit))
    d_unit = torch.stack([(x_unit - m) @ inv_unit @ (x_unit - m) for m in unit_means])
    torch.testing.assert_close(s["normalized_mahalanobis"], -d_unit.min()[None], rtol=1e-4, atol=1e-4)
    # a record made before the normalised statistics existed still scores the others and leaves this one out
    old = {k: v for k, v in stats.items() if not k.startswith("normalized_")}
    assert "normalized_mahalanobis" not in unknown_scores(logits, x, old) and "mahalanobis" in unknown_scores(
        logits, x, old
    )
    torch.testing.assert_close(s["energy"], torch.logsumexp(logits, -1))
    torch.testing.assert_close(s["msp"], logits.softmax(-1).max(-1).values)
    # far points: every feature score tells them apart; the threshold accepts 95% of the in-distribution points
    far = torch.randn(200, 3, generator=g) * 0.5 + torch.tensor([0.0, 8.0, 0.0])
    inside = unknown_scores(torch.zeros(1000, 2), feats, stats)
    outside = unknown_scores(torch.zeros(200, 2), far, stats)
    # (the relative form discounts what the whole set's Gaussian also finds far: weaker on points this far out)
    for name, least in (("mahalanobis", 0.99), ("relative_mahalanobis", 0.95), ("normalized_mahalanobis", 0.99),
                        ("knn", 0.99)):  # fmt: skip
        assert auroc(inside[name], outside[name]) > least and fpr_at_tpr(inside[name], outside[name]) < 0.2, name
        assert (inside[name] >= accept_threshold(inside[name])).double().mean() == pytest.approx(ACCEPT, abs=0.002)
    # features in a subspace (a LayerNorm-ed model's: here the third coordinate is minus the sum of the others) still
    # give distances, not the noise of inverting a zero variance
    flat = torch.cat([feats[:, :2], -feats[:, :2].sum(-1, keepdim=True)], dim=-1)
    far_flat = torch.cat([far[:, :2], -far[:, :2].sum(-1, keepdim=True)], dim=-1)
    stats_flat = feature_stats(flat, targets, 2)
    inside = unknown_scores(torch.zeros(1000, 2), flat, stats_flat)["mahalanobis"]
    assert auroc(inside, unknown_scores(torch.zeros(200, 2), far_flat, stats_flat)["mahalanobis"]) > 0.99
    assert auroc(torch.tensor([2.0, 3.0]), torch.tensor([0.0, 1.0])) == 1.0
    assert auroc(torch.tensor([0.0, 1.0]), torch.tensor([2.0, 3.0])) == 0.0
    assert auroc(torch.tensor([1.0, 2.0]), torch.tensor([2.0, 0.0])) == 0.625  # a tie counts a half
    # the area depends on the order alone: distances of hundreds (a 768-wide model's) score as small ones do
    for shift in (500.0, -1000.0):
        assert auroc(torch.tensor([2.0, 3.0]) + shift, torch.tensor([0.0, 1.0]) + shift) == 1.0, shift


def test_the_class_covariance_scores_by_their_formula_and_the_shared_default_above_the_cap(monkeypatch):
    """qda: the head's features' smallest over the classes of the squared distance under the class's own covariance
    plus its log-determinant, standardised on validation; block_qda: the same in every block, summed. Two classes of
    different spreads, which a shared covariance cannot tell apart. A class with too few images takes the shared
    covariance; a model whose class covariances would exceed the cap gets the shared-covariance default."""
    g = torch.Generator().manual_seed(0)
    targets = torch.arange(2).repeat(300)
    spread = torch.tensor([[0.2, 0.2], [2.0, 0.5]])  # (C, D): class 1 wide in its first direction
    # (N, L + 1 = 2, D): one block, then the head's features (shifted: each layer its own means)
    feats = spread[targets][:, None] * torch.randn(600, 2, 2, generator=g) + torch.tensor([[0.0], [1.0]])
    val = feats[:100] + 0.05 * torch.randn(100, 2, 2, generator=g)
    stats = block_scale(feature_stats(feats, targets, 2), val)
    assert stats["class_precision"].shape == (2, 2, 2, 2) and stats["class_logdet"].shape == (2, 2)

    def log_density(f, layer):  # minus twice the class Gaussian's log-density, without the constant; the best class
        out = []
        for c in range(2):
            z = feats[targets == c, layer]
            cov = (z - z.mean(0)).T @ (z - z.mean(0)) / len(z)
            out.append((f - z.mean(0)) @ torch.linalg.inv(cov) @ (f - z.mean(0)) + torch.logdet(cov))
        return torch.stack(out).min()

    x = torch.tensor([[[1.5, 0.0], [1.0, 2.5]]])  # far along class 1's narrow direction in the head
    z = []
    for layer in range(2):
        on_val = torch.stack([log_density(v, layer) for v in val[:, layer]])
        z.append((log_density(x[0, layer], layer) - on_val.mean()) / on_val.std())
    s = unknown_scores(torch.zeros(1, 2), x, stats)
    torch.testing.assert_close(s["qda"], -z[1][None], rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(s["block_qda"], -z[0][None], rtol=1e-3, atol=1e-3)
    # a class with no more than MIN_IMAGES_PER_DIM images a dimension: the layer's shared covariance
    few = feature_stats(feats[:7], targets[:7], 2)  # 4 and 3 images of 2 dimensions
    centred = feats[:7, 1] - torch.stack([feats[:7, 1][targets[:7] == c].mean(0) for c in range(2)])[targets[:7]]
    shared = torch.linalg.inv(centred.T @ centred / 7)
    torch.testing.assert_close(few["class_precision"][1, 0], shared, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(few["class_precision"][1, 1], shared, rtol=1e-4, atol=1e-4)
    # over the cap, no class covariances: the record applies the same parts under the shared covariance
    logits = torch.randn(600, 2, generator=g)
    inputs = torch.randn(600, 5, generator=g)
    train, val_out = (feats, logits, targets, inputs), (val, logits[:100], targets[:100], inputs[:100])
    assert rejection_record(train, val_out, ["a", "b"])["score"] == DEFAULT_SCORE
    monkeypatch.setattr(unknown, "CLASS_COVARIANCE_FLOATS", 2 * 2 * 2 * 2 - 1)
    capped = rejection_record(train, val_out, ["a", "b"])
    assert capped["score"] == SHARED_DEFAULT_SCORE and "class_precision" not in capped["stats"]


def test_the_blocks_score_sums_each_blocks_standardised_distance_and_the_model_gives_every_blocks_features():
    g = torch.Generator().manual_seed(0)
    targets = torch.arange(2).repeat(300)
    # (N, L + 1, D): two blocks, then the head's features; each block its own class means and spread
    centres = torch.tensor([[[2.0, 0.0], [0.0, 1.0], [1.0, 1.0]], [[-2.0, 0.0], [0.0, -1.0], [-1.0, -1.0]]])
    feats = centres[targets] + torch.randn(600, 3, 2, generator=g) * torch.tensor([[1.0], [0.3], [1.0]])
    val = centres[targets[:100]] + torch.randn(100, 3, 2, generator=g) * torch.tensor([[1.0], [0.3], [1.0]])
    stats = block_scale(feature_stats(feats, targets, 2), val)
    assert stats["block_means"].shape == (2, 2, 2) and stats["means"].shape == (2, 2)
    x = torch.tensor([[[0.5, 0.5], [0.2, -0.4], [9.0, 9.0]]])
    s = unknown_scores(torch.zeros(1, 2), x, stats)

    def nearest(f, block_feats):  # a block's squared distance to its nearest class mean, by explicit inverse
        means = torch.stack([block_feats[targets == c].mean(0) for c in range(2)])
        centred = block_feats - means[targets]
        inv = torch.linalg.inv(centred.T @ centred / len(centred))
        return torch.stack([(f - m) @ inv @ (f - m) for m in means]).min(-1).values

    z = []
    for i in range(2):
        on_val = torch.stack([nearest(v, feats[:, i]) for v in val[:, i]])
        z.append((nearest(x[0, i], feats[:, i]) - on_val.mean()) / on_val.std())
    torch.testing.assert_close(s["block_mahalanobis"], -sum(z)[None], rtol=1e-3, atol=1e-3)
    # the head's scores read the last entry only: the far head feature moves them, not the blocks' score
    assert s["mahalanobis"] < -20 and s["block_mahalanobis"] > -10
    # a record made before the blocks' statistics (the head's only) scores these features by their last entry
    old = {k: v for k, v in stats.items() if not k.startswith("block_")}
    before = unknown_scores(torch.zeros(1, 2), x, old)
    assert "block_mahalanobis" not in before
    torch.testing.assert_close(before["mahalanobis"], unknown_scores(torch.zeros(1, 2), x[:, -1], old)["mahalanobis"])
    # the model's pooled features: the mean patch token after each block (before the final norm), then the head's
    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(img_size=16, patch_size=4, embed_dim=32, depth=3, num_heads=2, num_classes=5))
    model.eval()
    seen = []
    hooks = [b.register_forward_hook(lambda m, i, o: seen.append(o.mean(1))) for b in model.blocks]
    images = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        feats, logits = pooled_features(model, images)
        reference = model(images)
    [h.remove() for h in hooks]
    assert feats.shape == (4, 4, 32)
    torch.testing.assert_close(feats[:, :3], torch.stack(seen[:3], 1))
    torch.testing.assert_close(logits, reference)
    torch.testing.assert_close(model.head(feats[:, -1]), reference)


def test_the_stored_threshold_rejects_at_most_5_percent_of_new_images_like_the_validation_ones():
    g = torch.Generator().manual_seed(0)
    rejected = []
    for n in (60, 295, 1000):  # a small validation split (the cells: 295) and a larger one
        for _ in range(400):
            val, new = torch.randn(n, generator=g), torch.randn(2000, generator=g)
            t = reject_threshold(val)
            k = math.floor((1 - ACCEPT) * (n + 1))
            assert int((val < t).sum()) == k - 1  # the k - 1 validation scores below the k-th lowest
            rejected.append((n, float((new < t).double().mean()), float((new < accept_threshold(val)).double().mean())))
        conformal = sum(r for m, r, _ in rejected if m == n) / 400
        quantile = sum(q for m, _, q in rejected if m == n) / 400
        # expected k / (n + 1) <= 5%; the plain quantile rejects 5% of the validation images and more of new ones
        assert conformal == pytest.approx(k / (n + 1), abs=0.003) and conformal <= 1 - ACCEPT + 0.003
        assert quantile > conformal
    assert reject_threshold(torch.arange(10.0)) == 0.0  # under 19 images: only what lies below them all


def test_each_class_loses_at_most_about_5_percent_with_its_own_threshold_where_the_shared_one_fails_it():
    """Three classes whose genuine images score differently (a class the model finds unusual, as the defective cells
    or one clothing class that lost 21.8% at the shared threshold): the shared threshold keeps 5% on average and takes
    far more of the low class; each class's own threshold (by predicted class) keeps each near 5% on new images."""
    g = torch.Generator().manual_seed(0)
    shift = torch.tensor([0.0, 2.0, -3.0])  # class 2's genuine images score lower
    n_val, n_new = 600, 20000

    def draw(n):
        c = torch.randint(0, 3, (n,), generator=g)
        logits = torch.nn.functional.one_hot(c, 3).float() * 5  # predicted = the class
        return shift[c] + torch.randn(n, generator=g), logits, c

    val_s, val_logits, _ = draw(n_val)
    new_s, new_logits, new_c = draw(n_new)
    shared = {"threshold": reject_threshold(val_s)}
    per_class = {**shared, "class_thresholds": class_thresholds(val_s, val_logits.argmax(-1), 3)}
    lost_shared = [float((new_s < thresholds_of(shared, new_logits))[new_c == c].double().mean()) for c in range(3)]
    lost_own = [float((new_s < thresholds_of(per_class, new_logits))[new_c == c].double().mean()) for c in range(3)]
    assert max(lost_shared) > 0.15  # the low class pays for the others
    assert max(lost_own) <= 0.08 and min(lost_own) >= 0.01, lost_own
    # a class predicted for fewer than MIN_CLASS_IMAGES validation images keeps the shared threshold
    few = torch.cat([torch.zeros(MIN_CLASS_IMAGES), torch.ones(MIN_CLASS_IMAGES - 1)]).long()
    assert class_thresholds(torch.randn(len(few), generator=g), few, 3)[1:] == [None, None]
    mixed = {"threshold": -9.0, "class_thresholds": [1.0, None, 2.0]}
    assert thresholds_of(mixed, torch.eye(3)).tolist() == [1.0, -9.0, 2.0]
    assert thresholds_of({"threshold": 0.5}, torch.eye(3)).tolist() == [0.5] * 3  # a record from before: shared


def test_the_input_statistics_tell_blurred_low_resolution_constant_and_noised_images_from_the_originals():
    """The "input" score: the Mahalanobis distance of each image's pixel statistics to the training images'. Images
    with strokes (random lines on black, as digits): blurred, downsampled and upsampled, constant and noised copies
    of new ones each score below the new originals; the fused score is the sum of its standardised parts."""
    import torchvision.transforms.v2.functional as TF

    from vit.evaluation.image_features import input_statistics
    from vit.evaluation.unknown import fusion_of, record_scores

    g = torch.Generator().manual_seed(0)

    def strokes(n):  # (n, 1, 32, 32) in [0, 1]: a few bright lines each
        x = torch.zeros(n, 1, 32, 32)
        for i in range(n):
            for _ in range(3):
                r, c = torch.randint(4, 28, (2,), generator=g).tolist()
                if torch.rand(1, generator=g) < 0.5:
                    x[i, 0, r, c - 4 : c + 4] = 1
                else:
                    x[i, 0, r - 4 : r + 4, c] = 1
        return x

    train, new = strokes(400), strokes(200)
    stats = feature_stats(torch.randn(400, 8), torch.zeros(400, dtype=torch.long), 1, inputs=input_statistics(train))
    score = lambda x: unknown_scores(torch.zeros(len(x), 1), None, stats, inputs=input_statistics(x))["input"]  # noqa: E731
    inside = score(new)
    kinds = {
        "blur": TF.gaussian_blur(new, [9, 9], [2.0, 2.0]),
        "lowres": TF.resize(TF.resize(new, [8, 8], antialias=True), [32, 32]),
        "constant": torch.rand(200, 1, 1, 1, generator=g).expand_as(new),
        "noise": (new + 0.3 * torch.randn(new.shape, generator=g)).clamp(0, 1),
    }
    for kind, x in kinds.items():
        assert auroc(inside, score(x)) > 0.95, kind
    assert input_statistics(kinds["constant"])[:, 1].max() < -9  # log(std + 1e-4): no -inf, far below any stroke's
    other = {"msp": torch.randn(50, generator=g) * 3 + 1, "energy": torch.randn(50, generator=g) * 0.1}
    record = {"score": "energy+msp", "fusion": fusion_of(other, "energy+msp"), "stats": {}}
    logits = torch.randn(50, 3, generator=g)
    got = record_scores(record, logits, None, None)
    z = lambda v: (v - v.mean()) / v.std()  # noqa: E731
    torch.testing.assert_close(
        record_scores(record, logits, None, None)["energy+msp"],
        (got["energy"] - record["fusion"]["center"][0]) / record["fusion"]["spread"][0]
        + (got["msp"] - record["fusion"]["center"][1]) / record["fusion"]["spread"][1],
    )
    record["fusion"] = fusion_of(got, "energy+msp")  # standardised on these very scores: each part mean 0, spread 1
    torch.testing.assert_close(
        record_scores(record, logits, None, None)["energy+msp"], z(got["energy"]) + z(got["msp"])
    )


def _noise_folder(folder, n=24, size=32):
    folder.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(folder / f"noise{i}.png")
    return folder


def test_fit_stores_a_threshold_that_accepts_95_percent_of_validation(smoke_run, smoke_ckpt, tmp_path, capsys):
    model, hp = load_model(smoke_ckpt)
    record = hp.unknown
    assert record["score"] == DEFAULT_SCORE and record["accept"] == ACCEPT
    assert set(record["thresholds"]) == {*SCORES, DEFAULT_SCORE}  # every candidate, for vit-eval --ood to compare
    parts = DEFAULT_SCORE.split("+")  # a fused default: each part standardised on the validation images
    assert len(parts) == 1 or len(record["fusion"]["center"]) == len(record["fusion"]["spread"]) == len(parts)
    assert {"msp", "energy", "mahalanobis", "normalized_mahalanobis", "knn"} <= set(SCORES)
    assert record["stats"]["means"].shape == (10, model.cfg.embed_dim)
    # vit-eval on the same validation split: 5% rejected (the threshold's quantile), every class reported
    assert eval_main(["--ckpt", str(smoke_ckpt), "--split", "val", "--out", str(tmp_path / "ev"),
                      "--ood", str(_noise_folder(tmp_path / "noise"))]) == 0  # fmt: skip
    metrics = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    rejected = metrics["unknown"]["rejected"]
    # split conformal: the k-th lowest of n validation scores, k = floor(0.05 (n + 1)); the k - 1 below it rejected,
    # counted in each predicted class with its own threshold, and among the rest with the shared one
    with open(tmp_path / "ev" / "predictions.csv") as f:
        predicted = [r["pred"] for r in csv.DictReader(f)]
    own = {hp.class_names[c] for c, t in enumerate(record["class_thresholds"]) if t is not None}
    groups = [predicted.count(c) for c in own] + [sum(p not in own for p in predicted)]
    want = sum(max(0, math.floor((1 - ACCEPT) * (n + 1)) - 1) for n in groups if n)
    assert own and rejected * metrics["n"] == pytest.approx(want) and rejected <= 1 - ACCEPT, (rejected, groups)
    assert len(metrics["unknown"]["rejected_per_class"]) == 10
    # per-class thresholds: one entry per class, those with too few validation images sharing (and listed)
    assert len(record["class_thresholds"]) == 10
    names = hp.class_names
    shared = [names[c] for c, t in enumerate(record["class_thresholds"]) if t is None]
    assert record["shared_threshold_classes"] == shared
    page = (tmp_path / "ev" / "index.html").read_text()
    assert "<h2>Unknown</h2>" in page and "called unknown" in page
    assert f"{100 * metrics['ood']['rejected_by_the_checkpoint']:.1f}%</b> of the --ood images" in page
    ood = metrics["ood"]
    assert set(ood) >= {"msp", "energy", "relative_mahalanobis", "normalized_mahalanobis", "knn",
                        "rejected_by_the_checkpoint"}  # fmt: skip
    assert all(0 <= r["auroc"] <= 1 and 0 <= r["fpr_at_95_tpr"] <= 1 for r in ood.values() if isinstance(r, dict))
    assert "--ood: score" in capsys.readouterr().out


def test_the_onnx_statistics_are_float32_beside_the_model_and_an_older_json_sidecar_still_loads(smoke_onnx, tmp_path):
    """The rejection statistics in `<model>.unknown.safetensors`: the file is the size of the float32 tensors (the
    JSON lists it replaces were ~4x that); a sidecar with the lists inside (older exports) gives the same record; a
    missing statistics file is one line naming it."""
    from vit.deployment.onnx_model import OnnxError, load_onnx

    meta = json.loads(Path(f"{smoke_onnx}.json").read_text())
    stats_path = Path(smoke_onnx).parent / meta["unknown"]["stats_file"]
    stats = load_file(str(stats_path))
    payload = sum(t.numel() * 4 for t in stats.values())
    assert payload > 0 and stats_path.stat().st_size <= payload + 4096  # the tensors and a small header
    assert Path(f"{smoke_onnx}.json").stat().st_size < 50_000  # preprocessing and thresholds only
    _, new = load_onnx(smoke_onnx)
    old = tmp_path / "old.onnx"  # an export as older versions wrote it: the statistics as JSON lists
    shutil.copy(smoke_onnx, old)
    legacy = {**meta["unknown"], "stats": {k: t.tolist() for k, t in stats.items()}}
    del legacy["stats_file"]
    Path(f"{old}.json").write_text(json.dumps({**meta, "unknown": legacy}))
    _, got = load_onnx(old)
    assert set(got.unknown["stats"]) == set(new.unknown["stats"])
    for k, t in new.unknown["stats"].items():
        torch.testing.assert_close(got.unknown["stats"][k], t)
    moved = tmp_path / "moved.onnx"  # the model and its JSON without the statistics file
    shutil.copy(smoke_onnx, moved)
    shutil.copy(f"{smoke_onnx}.json", f"{moved}.json")
    with pytest.raises(OnnxError, match=rf"no {stats_path.name} beside it"):
        load_onnx(moved)


def test_predict_and_the_onnx_export_say_unknown_alike(smoke_ckpt, smoke_onnx, tmp_path, capsys):
    noise = _noise_folder(tmp_path / "noise")
    files = sorted(map(str, noise.glob("*.png")))
    capsys.readouterr()
    assert predict_main(["--ckpt", str(smoke_ckpt), "--format", "json", *files]) == 0
    torch_answers = [r["unknown"] for r in json.loads(capsys.readouterr().out)]
    assert all(isinstance(u, bool) for u in torch_answers)
    _, hp = load_model(smoke_ckpt)
    record = hp.unknown
    sidecar = json.loads(Path(f"{smoke_onnx}.json").read_text())["unknown"]  # vit-export's (the session's)
    assert sidecar["score"] == record["score"] and sidecar["threshold"] == record["threshold"]
    assert "stats" not in sidecar and sidecar["stats_file"] == f"{Path(smoke_onnx).name}.unknown.safetensors"
    stats = load_file(str(Path(smoke_onnx).parent / sidecar["stats_file"]))  # float32, beside the model
    assert set(stats) == {
        "means",
        "block_means",
        "class_precision",
        "class_logdet",
        "qda_center",
        "qda_spread",
        "input_mean",
        "input_precision",
    }  # the default's three parts' only
    assert sidecar["fusion"] == record["fusion"] and sidecar["class_thresholds"] == record["class_thresholds"]
    assert np.allclose(stats["class_precision"].numpy(), record["stats"]["class_precision"].numpy())
    assert all(t.dtype == torch.float32 for t in stats.values())
    capsys.readouterr()
    assert predict_main(["--onnx", str(smoke_onnx), "--format", "json", *files]) == 0
    assert [r["unknown"] for r in json.loads(capsys.readouterr().out)] == torch_answers
    assert predict_main(["--ckpt", str(smoke_ckpt), "--format", "csv", files[0]]) == 0
    header, row = capsys.readouterr().out.strip().splitlines()
    assert header.split(",")[-2:] == ["unknown", "error"] and row.split(",")[-2] == str(torch_answers[0]).lower()


def test_a_threshold_between_two_images_marks_the_lower_one_in_the_table(smoke_ckpt, tmp_path, capsys):
    from vit.deployment.predict import predict

    files = sorted(map(str, _noise_folder(tmp_path / "noise", n=2).glob("*.png")))
    model, hp = load_model(smoke_ckpt)
    # the maximum of the raw softmax (score "msp") of each image
    msp = [r["predictions"][0]["prob"] for r in predict(model, files, hp, raw_probs=True, progress=False)]
    assert msp[0] != msp[1]
    ckpt = load_checkpoint(smoke_ckpt)
    ckpt["unknown"] = {**ckpt["unknown"], "score": "msp", "threshold": float(sum(msp) / 2), "stats": {},
                       "class_thresholds": None}  # fmt: skip
    torch.save(ckpt, tmp_path / "split.ckpt")
    capsys.readouterr()
    assert predict_main(["--ckpt", str(tmp_path / "split.ckpt"), *files]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    assert [("UNKNOWN" in row) for row in rows] == [m == min(msp) for m in msp]
    assert Rejector({"score": "msp", "threshold": 0.6, "stats": {}})(
        torch.tensor([[9.0, 0.0], [0.0, 0.0]]), None, None
    ).tolist() == [False, True]


def test_a_class_threshold_applies_to_the_images_predicted_as_that_class_in_predict_and_the_export(
    smoke_ckpt, tmp_path, capsys
):
    from sklearn.datasets import load_digits  # the smoke run's own kind of images: predicted as several classes

    files = []
    for i, d in enumerate(load_digits().images[:12]):
        files.append(str(tmp_path / f"digit{i}.png"))
        Image.fromarray((d * 255 / 16).astype(np.uint8)).resize((32, 32)).save(files[-1])
    capsys.readouterr()
    assert predict_main(["--ckpt", str(smoke_ckpt), "--format", "json", *files]) == 0
    predicted = [r["predictions"][0]["label"] for r in json.loads(capsys.readouterr().out)]
    ckpt = load_checkpoint(smoke_ckpt)
    names = ckpt["hyper_parameters"]["class_names"]
    strict = names.index(predicted[0])  # every image predicted as this class is unknown, no other image is
    per_class = [math.inf if c == strict else None for c in range(len(names))]
    ckpt["unknown"] = {**ckpt["unknown"], "threshold": -math.inf, "class_thresholds": per_class}
    torch.save(ckpt, tmp_path / "per_class.ckpt")
    want = [p == names[strict] for p in predicted]
    assert any(want) and not all(want), predicted  # both kinds, or the test could not tell per class from shared
    assert predict_main(["--ckpt", str(tmp_path / "per_class.ckpt"), "--format", "json", *files]) == 0
    assert [r["unknown"] for r in json.loads(capsys.readouterr().out)] == want
    onnx = tmp_path / "m.onnx"
    assert export_main(["--ckpt", str(tmp_path / "per_class.ckpt"), "--format", "onnx", "--out", str(onnx)]) == 0
    assert json.loads(Path(f"{onnx}.json").read_text())["unknown"]["class_thresholds"][strict] == math.inf
    capsys.readouterr()
    assert predict_main(["--onnx", str(onnx), "--format", "json", *files]) == 0
    assert [r["unknown"] for r in json.loads(capsys.readouterr().out)] == want
    ckpt["unknown"]["class_thresholds"] = [0.5]  # not one per class
    torch.save(ckpt, tmp_path / "bad.ckpt")
    with pytest.raises(CheckpointError, match=r"bad.ckpt: its 'unknown' class_thresholds must be 10 numbers or nulls"):
        load_model(tmp_path / "bad.ckpt")


def test_old_checkpoints_never_say_unknown_and_a_broken_record_is_one_line(smoke_ckpt, tmp_path, capsys):
    ckpt = load_checkpoint(smoke_ckpt)
    del ckpt["unknown"]
    torch.save(ckpt, tmp_path / "old.ckpt")
    files = sorted(map(str, _noise_folder(tmp_path / "noise", n=4).glob("*.png")))
    capsys.readouterr()
    assert predict_main(["--ckpt", str(tmp_path / "old.ckpt"), "--format", "json", *files]) == 0
    assert [r["unknown"] for r in json.loads(capsys.readouterr().out)] == [False] * 4
    ckpt["unknown"] = {"score": "knn", "threshold": 0.5, "stats": {"bank": torch.zeros(3, 7)}}
    torch.save(ckpt, tmp_path / "bad.ckpt")
    with pytest.raises(CheckpointError, match=r"bad.ckpt: unknown statistics 'bank' do not fit a \d+-wide, \d+-block"):
        load_model(tmp_path / "bad.ckpt")
    good = load_checkpoint(smoke_ckpt)["unknown"]
    ckpt["unknown"] = {**good, "stats": {**good["stats"], "block_center": torch.zeros(7)}}  # not one per block
    torch.save(ckpt, tmp_path / "bad.ckpt")
    with pytest.raises(CheckpointError, match=r"bad.ckpt: unknown statistics 'block_center' do not fit"):
        load_model(tmp_path / "bad.ckpt")
    shutil.rmtree(tmp_path / "noise")


def test_best_and_last_with_the_same_weights_are_measured_once(smoke_run, smoke_ckpt, tmp_path, monkeypatch):
    """measure_after_fit: a run that ended on its best epoch has best == last in weights; they are measured once (one
    validation pass, one training pass) and both files get the same temperature and rejection record. Files with
    other weights are measured on their own. Each file is read once and written once."""
    import vit.evaluation.after_fit as after_fit
    import vit.model.checkpoint as checkpoint
    from vit.training.checkpoint_io import AtomicCheckpointIO

    best, last, other = (tmp_path / f"{n}.ckpt" for n in ("best", "last", "other"))
    for path in (best, last, other):
        shutil.copy(smoke_ckpt, path)
    raw = torch.load(other, map_location="cpu", weights_only=True)
    key = next(k for k in raw["state_dict"] if k.endswith("head.weight"))
    raw["state_dict"][key] = raw["state_dict"][key] * 2  # other weights: other logits, other thresholds
    torch.save(raw, other)
    passes, reads, writes = [], [], []
    real_features, real_read, real_write = (
        after_fit.features_of,
        checkpoint.load_checkpoint,
        AtomicCheckpointIO.save_checkpoint,
    )
    monkeypatch.setattr(after_fit, "features_of", lambda *a: passes.append(1) or real_features(*a))
    monkeypatch.setattr(checkpoint, "load_checkpoint", lambda p, *a: reads.append(p) or real_read(p, *a))
    monkeypatch.setattr(
        AtomicCheckpointIO, "save_checkpoint", lambda self, c, p: writes.append(p) or real_write(self, c, p)
    )
    dm = smoke_run.cli.datamodule
    measured = after_fit.measure_after_fit([str(best), str(last), str(other)], dm, torch.device("cpu"))
    assert len(passes) == 4  # validation and training images of the two distinct weights
    assert sorted(map(str, reads)) == sorted(map(str, writes)) == sorted(map(str, (best, last, other)))
    assert measured[str(best)] is measured[str(last)] is not measured[str(other)]
    read = {p: torch.load(p, map_location="cpu", weights_only=True) for p in (best, last, other)}
    assert read[best]["calibration"] == read[last]["calibration"] == measured[str(best)]["calibration"]
    assert read[best]["unknown"]["threshold"] == read[last]["unknown"]["threshold"]
    assert read[other]["unknown"]["thresholds"]["max_logit"] != read[best]["unknown"]["thresholds"]["max_logit"]
    assert read[other]["calibration"]["temperature"] != read[best]["calibration"]["temperature"]
    line = after_fit.calibration_lines(measured[str(best)], dm, None, 0)
    assert f"temperature {read[best]['calibration']['temperature']:.3f}" in line and "balanced accuracy" in line
    assert after_fit.unknown_line(measured[str(best)]).startswith(f"unknown: {read[best]['unknown']['score']} below")


def test_an_export_and_a_record_from_before_the_blocks_still_say_unknown_alike(
    smoke_ckpt, tmp_path, capsys, monkeypatch
):
    """Before the blocks' features: the ONNX graph's features were the head's (B, D), the record's score `mahalanobis`
    with the head's statistics. Such an export applies its sidecar; such a checkpoint scores today's features by their
    last entry; both give the same answers, some unknown and some not."""
    import onnxruntime as ort

    import vit.deployment.export as export_module
    from vit.deployment.labelled import FileBatches
    from vit.evaluation.image_features import features_of

    def head_features(model, x):  # what pooled_features returned before the blocks
        feats = model.forward_head(model.forward_features(x), pre_logits=True)
        return feats, model.head(feats)

    files = sorted(map(str, _noise_folder(tmp_path / "noise", n=8).glob("*.png")))
    model, hp = load_model(smoke_ckpt)
    feats, logits, _, _ = features_of(model, FileBatches(files, [0] * 8, hp, 8, 0, torch.device("cpu")), "cpu")
    ckpt = load_checkpoint(smoke_ckpt)
    stats = {k: ckpt["unknown"]["stats"][k] for k in ("means", "precision")}
    scores = unknown_scores(logits, feats[:, -1], stats, names=("mahalanobis",))["mahalanobis"]
    threshold = float(scores.sort().values[3:5].mean())  # half below it, none within rounding of it
    ckpt["unknown"] = {"score": "mahalanobis", "threshold": threshold, "stats": stats}
    torch.save(ckpt, tmp_path / "old.ckpt")
    monkeypatch.setattr(export_module, "pooled_features", head_features)
    assert (
        export_main(["--ckpt", str(tmp_path / "old.ckpt"), "--format", "onnx", "--out", str(tmp_path / "m.onnx")]) == 0
    )
    monkeypatch.undo()
    assert len(ort.InferenceSession(str(tmp_path / "m.onnx")).get_outputs()[1].shape) == 2  # (B, D), as then
    capsys.readouterr()
    assert predict_main(["--ckpt", str(tmp_path / "old.ckpt"), "--format", "json", *files]) == 0
    from_checkpoint = [r["unknown"] for r in json.loads(capsys.readouterr().out)]
    assert from_checkpoint == (scores < threshold).tolist() and 0 < sum(from_checkpoint) < 8
    assert predict_main(["--onnx", str(tmp_path / "m.onnx"), "--format", "json", *files]) == 0
    assert [r["unknown"] for r in json.loads(capsys.readouterr().out)] == from_checkpoint
