"""`vit-eval` on a real training checkpoint: every output file, metrics that recompute from predictions.csv,
predictions equal to vit-predict's, each kind of DATA, bad input, and the page in a real browser."""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from browser import chromium, needs_chromium
from PIL import Image

from vit.commands.eval import main
from vit.commands.predict import main as predict_main
from vit.data.digits import DigitsDataModule
from vit.evaluation.report import metrics_of, prediction_rows, read_predictions, reliability_bins
from vit.model.checkpoint import load_checkpoint, load_model

OUTPUTS = (
    "metrics.json",
    "predictions.csv",
    "per_class.csv",
    "confusion_matrix.png",
    "reliability.png",
    "top_losses.png",
    "index.html",
)


@pytest.fixture(scope="module")
def labelled(tmp_path_factory) -> Path:
    """Real digits as a labelled folder: root/<class>/<n>.png, 8 per class, from the validation split."""
    root = tmp_path_factory.mktemp("labelled") / "digits"
    x, y = DigitsDataModule(img_size=32).memory["val"]
    for n, (img, t) in enumerate(zip(x, y.tolist())):
        if (y[:n] == t).sum() >= 8:
            continue
        (root / str(t)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(img.permute(1, 2, 0).numpy()).save(root / str(t) / f"{n:04d}.png")
    return root


@pytest.fixture(scope="module")
def report(smoke_ckpt, labelled, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report") / "eval"
    assert main(["--ckpt", str(smoke_ckpt), str(labelled), "--out", str(out), "--top-losses", "16"]) == 0
    return out


def test_every_output_is_written_and_metrics_json_has_every_field(report, smoke_ckpt):
    for name in OUTPUTS:
        assert (report / name).stat().st_size > 0, name
    m = json.loads((report / "metrics.json").read_text())
    fields = "n classes top1 top5 balanced_accuracy f1_macro per_class confusion_matrix most_confused nll ece"
    for key in fields.split() + ["ece_uncalibrated", "nll_uncalibrated", "temperature"]:
        assert key in m, key
    assert m["n"] == 80 and m["classes"] == [str(i) for i in range(10)]
    assert sum(map(sum, m["confusion_matrix"])) == 80 and len(m["confusion_matrix"]) == 10
    assert [r["support"] for r in m["per_class"]] == [8] * 10
    assert set(m["per_class"][0]) == {"class", "precision", "recall", "f1", "support"}
    assert m["temperature"] == load_model(smoke_ckpt)[1].temperature != 1.0
    assert 0 <= m["top1"] <= m["top5"] <= 1
    header = (report / "per_class.csv").read_text().splitlines()[0]
    assert header == "class,precision,recall,f1,support"
    assert (report / "predictions.csv").read_text().startswith("path,true,pred,prob,loss,")
    for png in OUTPUTS[3:6]:
        assert Image.open(report / png).size[0] > 300


def test_metrics_json_recomputes_exactly_from_predictions_csv(report):
    m = json.loads((report / "metrics.json").read_text())
    _, rows = read_predictions(report / "predictions.csv", m["classes"])
    again = metrics_of(rows, m["classes"], m["temperature"])
    assert json.loads(json.dumps(again)) == {k: v for k, v in m.items() if k not in ("skipped", "unknown")}


def test_predictions_equal_vit_predict_file_by_file(report, smoke_ckpt, labelled, capsys):
    paths, rows = read_predictions(report / "predictions.csv", [str(i) for i in range(10)])
    capsys.readouterr()
    assert predict_main(["--ckpt", str(smoke_ckpt), "--format", "json", "--topk", "1", str(labelled)]) == 0
    predicted = {r["path"]: r["predictions"][0] for r in json.loads(capsys.readouterr().out)}
    assert sorted(predicted) == sorted(paths)
    for path, pred, prob in zip(paths, rows["pred"].tolist(), rows["prob"].tolist()):
        assert predicted[path]["label"] == str(pred), path
        assert predicted[path]["prob"] == round(prob, 6), path


def test_the_numbers_are_those_of_the_logits(smoke_ckpt, labelled, report):
    """top-1, ECE and NLL against a direct computation from the model's logits of the same files."""
    from torchmetrics.functional.classification import multiclass_calibration_error

    model, hp = load_model(smoke_ckpt)
    paths, rows = read_predictions(report / "predictions.csv", [str(i) for i in range(10)])
    x = torch.stack([torch.from_numpy(np.array(Image.open(p).convert("RGB"))).permute(2, 0, 1) for p in paths])
    mean, std = torch.tensor(hp.mean)[:, None, None], torch.tensor(hp.std)[:, None, None]
    with torch.no_grad():
        logits = model((x.float() / 255 - mean) / std)
    t = hp.temperature
    m = json.loads((report / "metrics.json").read_text())
    assert m["top1"] == pytest.approx((logits.argmax(-1) == rows["true"]).float().mean().item())
    ece = multiclass_calibration_error((logits / t).softmax(-1), rows["true"], 10, n_bins=15).item()
    assert m["ece"] == pytest.approx(ece, abs=1e-5)
    nll = torch.nn.functional.cross_entropy(logits, rows["true"]).item()
    assert m["nll_uncalibrated"] == pytest.approx(nll, abs=1e-5)
    worst = rows["loss"].topk(16).values
    assert worst.min() >= rows["loss"].median()  # sanity of the loss column: top losses are large ones


def test_metrics_of_matches_scikit_learn():
    from sklearn.metrics import balanced_accuracy_score, f1_score, precision_recall_fscore_support

    g = torch.Generator().manual_seed(3)
    logits = torch.randn(300, 7, generator=g)
    targets = torch.randint(0, 6, (300,), generator=g)  # class 6 never a target
    logits[targets == 2, 2] += 2  # some signal
    rows = prediction_rows(logits, targets, 0.7)
    m = metrics_of(rows, [f"c{i}" for i in range(7)], 0.7)
    y, p = targets.numpy(), logits.argmax(-1).numpy()
    assert m["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(y, p))
    assert m["f1_macro"] == pytest.approx(f1_score(y, p, average="macro"))
    prec, rec, f1, support = precision_recall_fscore_support(y, p, labels=range(7), zero_division=0)
    assert [r["precision"] for r in m["per_class"]] == pytest.approx(prec.tolist())
    assert [r["recall"] for r in m["per_class"]] == pytest.approx(rec.tolist())
    assert [r["support"] for r in m["per_class"]] == support.tolist()
    top5 = (logits.topk(5).indices == targets[:, None]).any(-1).float().mean().item()
    assert m["top5"] == pytest.approx(top5)
    assert m["most_confused"][0]["count"] == max(
        int(((targets == i) & (logits.argmax(-1) == j)).sum()) for i in range(7) for j in range(7) if i != j
    )


def test_reliability_bins_are_torchmetrics_bins():
    """The diagram's bins give back torchmetrics' ECE: the same 15 bins."""
    from torchmetrics.functional.classification import binary_calibration_error

    g = torch.Generator().manual_seed(0)
    conf, correct = torch.rand(500, generator=g), torch.rand(500, generator=g) < 0.7
    c, a, n = reliability_bins(conf, correct)
    ece = ((c - a).abs().nan_to_num(0) * n / n.sum()).sum().item()
    assert ece == pytest.approx(binary_calibration_error(conf, correct.long(), n_bins=15).item(), abs=1e-6)


def test_raw_probs_serve_the_softmax_as_it_was(smoke_ckpt, labelled, tmp_path, capsys):
    assert main(["--ckpt", str(smoke_ckpt), str(labelled), "--out", str(tmp_path), "--raw-probs"]) == 0
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["temperature"] == 1.0 and m["ece"] == m["ece_uncalibrated"] and m["nll"] == m["nll_uncalibrated"]


def test_split_val_evaluates_the_validation_split_as_training_did(smoke_run, smoke_ckpt, tmp_path, in_tmp, capsys):
    import train

    assert load_checkpoint(smoke_ckpt)["data"]["class_path"] == "vit.data.DigitsDataModule"
    assert main(["--ckpt", str(smoke_ckpt), "--split", "val", "--out", str(tmp_path)]) == 0
    m = json.loads((tmp_path / "metrics.json").read_text())
    # Lightning's own validation of the same checkpoint, over the whole split
    cli = train.main(
        ["validate", "--config", str(Path(__file__).parents[2] / "configs" / "smoke.yaml"),
         "--ckpt_path", str(smoke_ckpt), "--trainer.limit_val_batches", "1.0", "--trainer.logger", "false",
         "--trainer.enable_progress_bar", "false"]
    )  # fmt: skip
    assert m["n"] == len(DigitsDataModule().memory["val"][1])
    assert m["top1"] == pytest.approx(float(cli.trainer.callback_metrics["val/acc"]), abs=1e-6)
    assert m["balanced_accuracy"] == pytest.approx(float(cli.trainer.callback_metrics["val/acc_balanced"]), abs=1e-6)


def test_split_val_of_a_folder_run_reads_its_validation_files(tmp_path, labelled, in_tmp, capsys):
    from conftest import fit_in

    data = tmp_path / "data"
    for split in ("train", "val"):
        shutil.copytree(labelled, data / split)
    fit_in(tmp_path, [
        "fit", "--data.root", str(data), "--trainer.max_epochs", "1", "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false", "--plan", "false", "--model.arch.embed_dim", "32",
        "--model.arch.depth", "1", "--model.arch.num_heads", "2",
    ])  # fmt: skip
    ckpt = next((tmp_path / "checkpoints").rglob("last.ckpt"))
    out = tmp_path / "out"
    assert main(["--ckpt", str(ckpt), "--split", "val", "--out", str(out)]) == 0
    paths, _ = read_predictions(out / "predictions.csv", [str(i) for i in range(10)])
    assert sorted(Path(p).relative_to(data / "val").as_posix() for p in paths) == sorted(
        p.relative_to(labelled).as_posix() for p in labelled.rglob("*.png")
    )


def test_a_torchvision_test_split(smoke_ckpt, tmp_path, capsys):
    from formats import write_mnist
    from torchvision.datasets import MNIST

    from vit.training.checkpoint_io import AtomicCheckpointIO

    write_mnist(tmp_path / "data", n_train=12, n_test=9)
    ckpt = load_checkpoint(smoke_ckpt)
    ckpt["hyper_parameters"]["class_names"] = list(MNIST.classes)  # as a run on torch/mnist names its classes
    AtomicCheckpointIO().save_checkpoint(ckpt, tmp_path / "mnist.ckpt")
    out = tmp_path / "out"
    args = ["--ckpt", str(tmp_path / "mnist.ckpt"), "torch/mnist", "--download-root", str(tmp_path / "data")]
    assert main([*args, "--out", str(out)]) == 0
    paths, rows = read_predictions(out / "predictions.csv", list(MNIST.classes))
    assert paths[0] == "torch/mnist/test/000000" and rows["true"].tolist() == [i % 10 for i in range(9)]

    # the old spelling, --data-root, still reads the same folder
    assert main(["--ckpt", str(smoke_ckpt), "torch/mnist", "--data-root", str(tmp_path / "data"), "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: torch/mnist: its classes") and "\n" not in err


def test_bad_input_is_one_line_naming_it(smoke_ckpt, labelled, tmp_path, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(labelled, bad)
    (bad / "cats").mkdir()
    assert main(["--ckpt", str(smoke_ckpt), str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith(f"error: {bad / 'cats'}: 'cats' is not one of the checkpoint's 10 classes") and "\n" not in err
    )
    assert not (tmp_path / "o").exists()  # nothing written for a refused run

    (bad / "cats").rmdir()
    Image.new("RGB", (8, 8)).save(bad / "loose.png")
    assert main(["--ckpt", str(smoke_ckpt), str(bad), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {bad / 'loose.png'}: not inside a class folder " + (
        f"(expected {bad}/<class>/<image>)"
    )
    (bad / "loose.png").unlink()
    (bad / "3" / "broken.png").write_text("not an image")
    assert main(["--ckpt", str(smoke_ckpt), str(bad), "--out", str(tmp_path / "o")]) == 1  # done, one file skipped
    m = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert m["n"] == 80 and [s["path"] for s in m["skipped"]] == [str(bad / "3" / "broken.png")]

    with pytest.raises(SystemExit):  # neither DATA nor --split
        main(["--ckpt", str(smoke_ckpt), "--out", str(tmp_path / "o")])


def test_split_val_of_a_checkpoint_without_a_data_record(smoke_ckpt, tmp_path, capsys):
    from vit.training.checkpoint_io import AtomicCheckpointIO

    ckpt = load_checkpoint(smoke_ckpt)
    del ckpt["data"]
    AtomicCheckpointIO().save_checkpoint(ckpt, tmp_path / "old.ckpt")
    assert main(["--ckpt", str(tmp_path / "old.ckpt"), "--split", "val", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "holds no record of its training data" in err and "\n" not in err

    ckpt["data"] = {"class_path": "os.system", "init_args": {"command": "touch pwned"}}
    AtomicCheckpointIO().save_checkpoint(ckpt, tmp_path / "evil.ckpt")
    assert main(["--ckpt", str(tmp_path / "evil.ckpt"), "--split", "val", "--out", str(tmp_path / "o")]) == 2
    assert "is not one of this toolkit's" in capsys.readouterr().err


def test_python_dash_m_entry(smoke_ckpt, labelled, tmp_path, monkeypatch, capsys):
    """`python -m vit.commands.eval ...`: the module's __main__ block, run as -m runs it (runpy), in this process (a
    new interpreter would spend 5 s importing torch; the console scripts' own processes: test_package.py)."""
    import runpy

    argv = ["vit.commands.eval", "--ckpt", str(smoke_ckpt), str(labelled), "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as e:
        runpy.run_module("vit.commands.eval", run_name="__main__", alter_sys=True)
    assert e.value.code in (0, None)
    assert "80 images: top-1" in capsys.readouterr().out and (tmp_path / "index.html").is_file()


@needs_chromium
def test_the_page_renders_in_a_real_browser_with_nothing_fetched_and_no_console_error(report, tmp_path):
    from browser import Browser

    page_text = (report / "index.html").read_text()
    assert "http://" not in page_text and "https://" not in page_text and "<script" not in page_text
    with Browser(chromium(), tmp_path) as page:
        page.send("Log.enable")
        page.open((report / "index.html").as_uri())
        page.wait_for("[...document.images].every(i => i.complete && i.naturalWidth > 0)")
        assert page.evaluate("document.images.length") == 3
        heading = page.evaluate("document.querySelector('h1').textContent")
        assert heading.startswith("last.ckpt on ")
        rows = page.evaluate("[...document.querySelectorAll('table')[1].rows].length")
        assert rows == 11  # header and one per class
        fetched = page.evaluate("performance.getEntriesByType('resource').map(e => e.name)")
        assert all(u.startswith("data:") for u in fetched), fetched
        page.screenshot(tmp_path / "page.png")
        errors = [e for e in page.events if e["method"] == "Runtime.exceptionThrown"]
        errors += [
            e
            for e in page.events
            if e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] in ("error", "warning")
        ]
        errors += [
            e
            for e in page.events
            if e["method"] == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "warning")
        ]
        assert errors == []
    width, height = Image.open(tmp_path / "page.png").size
    assert width == 1000 and height > 300
