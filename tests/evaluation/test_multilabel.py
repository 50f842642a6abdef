"""Several labels an image: a labels file with a delimited label list trains sigmoid outputs (BCE), thresholds per
label are chosen on validation after fit, and every output (predict's table/JSON/CSV, vit-eval, the ONNX sidecar,
the server's worker) gives every label above its threshold."""

import csv
import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from vit.data.folder import ImageFolderDataModule
from vit.data.listing import list_data
from vit.data.val_split import split_validation
from vit.evaluation.multilabel import label_thresholds, majority_baseline, multilabel_scores
from vit.training.multilabel import multilabel_loss

LABELS = ("cat", "dog", "car")


def _pictures(root: Path, n: int, seed: int = 0) -> list[tuple[str, list[str]]]:
    """n 16-px pictures: a bright square per label present (cat top-left, dog top-right, car bottom), labels drawn at
    random, at least one each."""
    rng = np.random.default_rng(seed)
    (root / "pics").mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(n):
        on = [name for name in LABELS if rng.random() < 0.45] or [LABELS[i % 3]]
        a = rng.integers(0, 40, (16, 16, 3), dtype=np.uint8)
        for name in on:
            y, x = {"cat": (0, 0), "dog": (0, 8), "car": (8, 4)}[name]
            a[y : y + 8, x : x + 8] = 230
        Image.fromarray(a).save(root / "pics" / f"{i}.png")
        out.append((f"pics/{i}.png", on))
    return out


def _labels_file(root: Path, n: int = 48, test: int = 9) -> Path:
    rows = ["path,labels,split"] + [
        f"{p},{' '.join(on)},{'test' if i >= n - test else 'train'}" for i, (p, on) in enumerate(_pictures(root, n))
    ]
    (root / "labels.csv").write_text("\n".join(rows) + "\n")
    return root / "labels.csv"


def test_a_label_that_is_never_an_images_rarest_is_not_taken_for_an_empty_class(tmp_path):
    """Every image carries "cat" and one rarer label: "cat" is no image's class index (its rarest label), yet it holds
    every training image; the empty-class check counts every label (it stopped the run: "class(es) ['cat'] hold no
    usable training image")."""
    pictures = _pictures(tmp_path, 24)
    rows = ["path,labels"] + [f"{p},cat {'dog' if i % 2 else 'car'}" for i, (p, _) in enumerate(pictures)]
    (tmp_path / "labels.csv").write_text("\n".join(rows) + "\n")
    listing = list_data(tmp_path, labels=tmp_path / "labels.csv", label_delimiter=" ")
    cat = listing.class_names.index("cat")
    assert all(cls != cat for _, cls in listing.splits["train"])  # never the class index
    dm = ImageFolderDataModule(str(tmp_path), labels=str(tmp_path / "labels.csv"), label_delimiter=" ", img_size=16,
                               num_workers=0)  # fmt: skip
    x, y = next(iter(dm.train_dataloader()))
    assert dm.task == "multilabel" and (y[:, cat] == 1).all()


def test_a_delimited_label_list_is_multi_label_and_every_label_reaches_validation(tmp_path):
    labels = _labels_file(tmp_path)
    listing = list_data(tmp_path, labels=labels, label_delimiter=" ")
    assert listing.class_names == sorted(LABELS) and "multi-label, 3 labels" in listing.found
    counts = {c: sum(c in ls for ls in listing.multi.values()) for c in range(3)}
    for path, cls in listing.splits["train"]:
        assert cls in listing.multi[path] and all(counts[cls] <= counts[c] for c in listing.multi[path])
    train, val = split_validation(listing.splits["train"], 0.2, 0, multi=listing.multi)
    assert {c for p, _ in val for c in listing.multi[p]} == {0, 1, 2}
    dm = ImageFolderDataModule(str(tmp_path), labels=str(labels), label_delimiter=" ", img_size=16, num_workers=0)
    assert dm.task == "multilabel"
    x, y = next(iter(dm.val_dataloader()))
    assert y.dtype == torch.float32 and y.shape[1] == 3 and set(y.unique().tolist()) <= {0.0, 1.0}
    for (path, _), row in zip(dm.samples["val"], y):
        assert [c for c in range(3) if row[c] == 1] == list(listing.multi[path])
    assert dm.class_counts() == dm.memory["train"][1].sum(0).long().tolist()


def test_the_loss_is_binary_cross_entropy_and_leaves_padding_rows_out():
    from vit.data.device import IGNORE

    logits, targets = torch.randn(4, 3), torch.tensor([[1.0, 0, 1], [0, 1, 0], [1, 1, 1], [0, 0, 0]])
    ref = torch.nn.functional.binary_cross_entropy_with_logits(logits[:3], targets[:3])
    padded = targets.clone()
    padded[3] = IGNORE
    torch.testing.assert_close(multilabel_loss(logits, padded), ref)


def test_thresholds_maximise_each_labels_f1_and_the_scores_match_scikit_learn():
    from sklearn.metrics import average_precision_score, f1_score

    probs = torch.tensor([[0.9, 0.2], [0.7, 0.6], [0.4, 0.55], [0.35, 0.1], [0.1, 0.5]])
    targets = torch.tensor([[1.0, 0], [1, 1], [1, 1], [0, 0], [0, 0]])
    thresholds = label_thresholds(probs, targets)
    # label 0: the top three are the positives -> between 0.4 and 0.35; label 1: between 0.55 and 0.5
    assert thresholds == [pytest.approx(0.375), pytest.approx(0.525)]
    s = multilabel_scores(probs, targets, thresholds)
    pred = (probs >= torch.tensor(thresholds)).numpy()
    assert s["f1_macro"] == pytest.approx(f1_score(targets.numpy(), pred, average="macro")) == 1.0
    assert s["mAP"] == pytest.approx(average_precision_score(targets.numpy(), probs.numpy(), average="macro"))
    base = majority_baseline(torch.tensor([0.6, 0.2]), targets)  # label 0 given to all, label 1 to none
    assert base["per_label"]["recall"] == [1.0, 0.0] and base["mAP"] == pytest.approx((3 / 5 + 2 / 5) / 2)


@pytest.fixture(scope="module")
def multilabel_run(tmp_path_factory):
    """One planned fit from a multi-label labels file with a test split; the folder, the checkpoint, what it printed."""
    from contextlib import redirect_stdout
    from io import StringIO

    from conftest import fit_in

    root = tmp_path_factory.mktemp("multilabel")
    _labels_file(root)
    printed = StringIO()
    quick = ["--trainer.max_epochs", "3", "--data.init_args.num_workers", "0", "--model.arch.depth", "1"]
    quick += [
        "--trainer.enable_progress_bar",
        "false",
        "--data.label_delimiter",
        " ",
        "--attention_maps.every_n_epochs",
        "3",
    ]
    with redirect_stdout(printed):
        cli = fit_in(root, ["fit", "--data.root", ".", "--data.labels", "labels.csv", *quick])
    ckpt = Path(cli.trainer.checkpoint_callback.best_model_path)
    return SimpleNamespace(root=root, cli=cli, ckpt=ckpt, out=printed.getvalue())


def test_fit_chooses_by_map_stores_thresholds_and_scores_the_test_split(multilabel_run):
    from vit.model.checkpoint import load_checkpoint, load_model

    run = multilabel_run
    assert run.cli.trainer.checkpoint_callback.monitor == "val/mAP"
    assert "multi-label: a threshold per label chosen on the validation set" in run.out
    assert "(per-label majority: mAP" in run.out and "test split (9 images" in run.out
    ckpt = load_checkpoint(run.ckpt)
    assert len(ckpt["multilabel"]["thresholds"]) == 3 and "calibration" not in ckpt and "unknown" not in ckpt
    _, hparams = load_model(run.ckpt)
    assert hparams.task == "multilabel" and hparams.thresholds == ckpt["multilabel"]["thresholds"]
    logs = run.root / "logs" / "folder" / "version_0"
    metrics = json.loads((logs / "test_metrics.json").read_text())
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = EventAccumulator(str(logs)).Reload().Tags()
    assert "attention/relevance" in tags["images"] and "val/mAP" in tags["scalars"]  # maps of multi-label images
    assert metrics["images"] == 9 and 0 <= metrics["mAP"] <= 1 and len(metrics["per_label"]["ap"]) == 3


def test_predict_gives_every_label_above_its_threshold_in_each_format(multilabel_run, capsys, monkeypatch):
    from vit.commands.predict import main
    from vit.model.checkpoint import load_model

    run = multilabel_run
    model, hparams = load_model(run.ckpt)
    assert hparams.class_names == ["car", "cat", "dog"]
    # car by its probability, cat always, dog never (1.0: p < 1 in float)
    hparams = dataclasses.replace(hparams, thresholds=[0.5, 0.0, 1.0])
    monkeypatch.setattr("vit.commands.predict.load_model_or_report", lambda path: (model, hparams))
    files = [str(run.root / "pics" / f"{i}.png") for i in range(3)]
    assert main(["--ckpt", str(run.ckpt), "--format", "json", "--topk", "3", *files]) == 0
    records = json.loads(capsys.readouterr().out)
    for rec in records:
        probs = {p["label"]: p["prob"] for p in rec["predictions"]}
        assert set(probs) == set(LABELS)  # every label's own probability
        assert rec["labels"] == [c for c in sorted(probs, key=probs.get, reverse=True) if c != "dog" and
                                 (c == "cat" or probs[c] >= 0.5)]  # fmt: skip
    assert main(["--ckpt", str(run.ckpt), "--format", "csv", "--topk", "3", *files]) == 0
    rows = list(csv.DictReader(capsys.readouterr().out.splitlines()))
    assert [r["labels"].split(";") for r in rows] == [rec["labels"] for rec in records]
    assert main(["--ckpt", str(run.ckpt), "--topk", "3", *files]) == 0
    assert f"[{', '.join(records[0]['labels'])}]" in capsys.readouterr().out
    # a relevance map per label given: cat for every image (threshold 0), never dog, car where it is above 0.5
    out = run.root / "label_maps"
    assert main(["--ckpt", str(run.ckpt), "--attention-out", str(out), *files]) == 0
    written = sorted(f.name for f in out.iterdir())
    expected = sorted(f"{i:05d}_{i}_{label}.png" for i, rec in enumerate(records) for label in rec["labels"])
    assert [n for n in written if n.count("_") == 2] == expected and expected
    assert {Image.open(out / n).size for n in written} == {Image.open(out / "00000_0.png").size}


def test_vit_eval_reports_map_and_f1_beside_the_per_label_majority(multilabel_run, tmp_path, capsys):
    from vit.commands.eval import main

    run = multilabel_run
    assert main(["--ckpt", str(run.ckpt), "--split", "test", "--out", str(tmp_path)]) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["task"] == "multilabel" and metrics["n"] == 9
    assert set(metrics["baseline"]) == {"mAP", "f1_macro", "f1_micro"}
    assert [r["label"] for r in metrics["per_label"]] == sorted(LABELS)
    assert "per-label majority: mAP" in capsys.readouterr().out
    assert len(list(csv.reader(open(tmp_path / "predictions.csv")))) == 10
    assert "<h2>Per label</h2>" in (tmp_path / "index.html").read_text()
    assert main(["--ckpt", str(run.ckpt), str(run.root / "pics"), "--out", str(tmp_path / "x")]) == 2
    assert "is scored on --split val or --split test" in capsys.readouterr().err


def test_onnx_sidecar_and_server_worker_give_the_same_labels_as_predict(multilabel_run, tmp_path, capsys):
    from vit.commands.export import main as export_main
    from vit.commands.predict import main as predict_main
    from vit.deployment.serve import ViTAPI, decode_upload

    run = multilabel_run
    files = [str(run.root / "pics" / f"{i}.png") for i in range(4)]
    assert predict_main(["--ckpt", str(run.ckpt), "--format", "json", "--topk", "3", *files]) == 0
    expected = json.loads(capsys.readouterr().out)
    onnx = tmp_path / "m.onnx"
    assert export_main(["--ckpt", str(run.ckpt), "--format", "onnx", "--out", str(onnx)]) == 0
    sidecar = json.loads(Path(f"{onnx}.json").read_text())
    assert sidecar["task"] == "multilabel" and len(sidecar["thresholds"]) == 3
    capsys.readouterr()
    assert predict_main(["--onnx", str(onnx), "--format", "json", "--topk", "3", *files]) == 0
    assert [r["labels"] for r in json.loads(capsys.readouterr().out)] == [r["labels"] for r in expected]
    api = ViTAPI(run.ckpt)
    before = torch.get_num_threads()
    try:
        api.setup("cpu")
    finally:
        torch.set_num_threads(before)
    items = [(decode_upload(Path(f).read_bytes(), 16, 3, 10**6), 3, "none", False) for f in files]
    assert [a["labels"] for a in api.predict(items)] == [r["labels"] for r in expected]
