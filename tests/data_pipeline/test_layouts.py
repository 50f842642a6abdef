"""Data as users lay it out (vit/data/listing.py): split folders with a test split, labels files, validation splits
that keep classes and groups, photos turned upright by their EXIF orientation."""

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vit.data.folder import ImageFolderDataModule
from vit.data.images import load_image
from vit.data.listing import list_data
from vit.data.transforms import DataError
from vit.data.val_split import class_quotas, split_validation


def _images(folder: Path, n: int, seed: int, size=(12, 12), prefix="") -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        path = folder / f"{prefix}{seed}-{i}.png"
        Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(path)
        out.append(path)
    return out


def _layout(root: Path, splits: dict[str, int], classes=("a", "b")) -> None:
    for split, n in splits.items():
        for k, c in enumerate(classes):
            _images(root / split / c, n, seed=10 * k + len(split))


def test_train_and_test_folders_train_on_train_choose_on_its_val_split_and_hold_test_apart(tmp_path):
    _layout(tmp_path, {"train": 10, "test": 3})
    dm = ImageFolderDataModule(str(tmp_path), img_size=12, num_workers=0, val_fraction=0.2)
    assert dm.class_names == ["a", "b"]  # not ["test", "train"]
    assert dm.listing.found == "train/ + test/"
    n = {split: len(items) for split, items in dm.samples.items()}
    assert n == {"train": 16, "val": 4, "test": 6}
    test_files = {p for p, _ in dm.samples["test"]}
    assert all("/test/" in p for p in test_files)
    assert test_files.isdisjoint(p for s in ("train", "val") for p, _ in dm.samples[s])
    dm.setup("test")
    batches = list(dm.test_dataloader())
    targets = torch.cat([y for _, y in batches])
    assert sorted(targets.tolist()) == [0, 0, 0, 1, 1, 1]  # the test images, not the validation split
    # streaming: the same test split, decoded per item
    streamed = ImageFolderDataModule(str(tmp_path), img_size=12, num_workers=0, in_memory=False)
    streamed.setup("test")
    x = torch.cat([x for x, _ in streamed.test_dataloader()])
    torch.testing.assert_close(x, torch.cat([x for x, _ in batches]))


def test_all_three_splits_given_and_hugging_faces_names(tmp_path):
    _layout(tmp_path, {"train": 4, "validation": 2, "test": 2})
    dm = ImageFolderDataModule(str(tmp_path), img_size=12, num_workers=0)
    assert {s: len(v) for s, v in dm.samples.items()} == {"train": 8, "val": 4, "test": 4}


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda r: _layout(r, {"train": 2, "val": 2, "valid": 2}), r"val/ and valid/ are both val splits"),
        (lambda r: _layout(r, {"test": 2, "c": 2}), r"test/ found but no train/"),
        (lambda r: (_layout(r, {"train": 2, "test": 2}), _images(r / "cat", 2, 0)), r"beside other folders \['cat'\]"),
        (lambda r: (_layout(r, {"train": 2}), _layout(r, {"test": 2}, ("a", "zebra"))), r"classes \['zebra'\]"),
    ],
    ids=["two-val-names", "test-without-train", "splits-beside-classes", "class-only-in-test"],
)
def test_a_layout_read_more_than_one_way_stops_naming_what_was_found(tmp_path, make, message):
    make(tmp_path)
    with pytest.raises(DataError, match=message) as e:
        ImageFolderDataModule(str(tmp_path), img_size=12, num_workers=0)
    assert "\n" not in str(e.value) and str(tmp_path) in str(e.value)


def _csv(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_labels_file_names_files_anywhere_under_root_with_split_and_group_columns(tmp_path):
    files = _images(tmp_path / "all", 12, 0) + _images(tmp_path / "more" / "deep", 4, 1)
    rows = ["file_name,label,split,group"]  # Hugging Face's metadata.csv names
    for i, f in enumerate(files):
        split = "test" if i >= 14 else ("validation" if i >= 12 else "train")
        rows.append(f"{f.relative_to(tmp_path)},{'cat' if i % 2 else 'dog'},{split},g{i // 2}")
    labels = _csv(tmp_path / "metadata.csv", "\n".join(rows) + "\n")
    dm = ImageFolderDataModule(str(tmp_path), labels=str(labels), img_size=12, num_workers=0)
    assert dm.class_names == ["cat", "dog"]
    assert {s: len(v) for s, v in dm.samples.items()} == {"train": 12, "val": 2, "test": 2}
    assert dict(dm.samples["train"])[str(files[1])] == 0 and dict(dm.samples["train"])[str(files[0])] == 1
    assert dm.listing.groups[str(files[3])] == "g1"


def test_a_tsv_with_columns_named_by_flag(tmp_path):
    files = _images(tmp_path / "x", 6, 0)
    text = "img\tkind\n" + "".join(f"{f.name}\t{'ab'[i % 2]}\n" for i, f in enumerate(files))
    labels = _csv(tmp_path / "l.tsv", text)
    listing = list_data(tmp_path / "x", labels=labels, path_column="img", label_column="kind")
    assert listing.class_names == ["a", "b"] and len(listing.splits["train"]) == 6
    with pytest.raises(DataError, match=r"l.tsv: no column 'path' \(--data.path_column\); the columns are"):
        list_data(tmp_path / "x", labels=labels, path_column="path")
    with pytest.raises(DataError, match=r"no path column among \['img', 'kind'\]: name it with --data.path_column"):
        list_data(tmp_path / "x", labels=labels)


@pytest.mark.parametrize(
    "row, says",
    [
        (",a", r"labels.csv:4: no path in column 'path'"),
        ("nope.png,a", r"labels.csv:4: nope.png: no such file under"),
        ("{f},", r"labels.csv:4: .*: empty label in column 'label'"),
        ("{f0},a", r"labels.csv:4: .*: duplicate of line 2"),
    ],
    ids=["no-path", "missing-file", "empty-label", "duplicate-row"],
)
def test_a_bad_row_is_one_line_naming_it_skipped_or_with_strict_an_error(tmp_path, caplog, row, says):
    files = _images(tmp_path, 3, 0)
    rows = [f"{f.name},{'ab'[i % 2]}" for i, f in enumerate(files[:2])]
    rows.append(row.format(f=files[2].name, f0=files[0].name))
    labels = _csv(tmp_path / "labels.csv", "path,label\n" + "\n".join(rows) + "\n")
    with caplog.at_level("WARNING"):
        listing = list_data(tmp_path, labels=labels)
    assert len(listing.splits["train"]) == 2
    assert any(re.search(says, r.getMessage()) for r in caplog.records), caplog.text
    with pytest.raises(DataError, match=says) as e:
        list_data(tmp_path, labels=labels, strict=True)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "rows, says",
    [
        ("{f0},a\n{f0},b\n", r"labels.csv:3: .* is labelled 'b' here and 'a' on line 2"),
        ("{f0},a,train\n{f1},b,holdout\n", r"labels.csv:3: split 'holdout' is none of"),
        ("{f0},a,train\n{f1},b,test\n", r"classes \['b'\] appear in val/test rows but in no training row"),
    ],
    ids=["two-labels", "unknown-split", "class-only-in-test"],
)
def test_a_contradiction_in_the_labels_file_stops_the_run(tmp_path, rows, says):
    files = _images(tmp_path, 2, 0)
    header = "path,label,split\n" if rows.count(",") > rows.count("\n") else "path,label\n"
    labels = _csv(tmp_path / "labels.csv", header + rows.format(f0=files[0].name, f1=files[1].name))
    with pytest.raises(DataError, match=says):
        list_data(tmp_path, labels=labels)


def test_the_validation_split_is_stratified_and_a_rare_class_gets_a_validation_image():
    items = [(f"a{i}", 0) for i in range(90)] + [(f"b{i}", 1) for i in range(8)] + [("c0", 2), ("c1", 2)]
    train, val = split_validation(items, 0.2, seed=0)
    per_class = [sum(t == c for _, t in val) for c in range(3)]
    # 20 of 100 shared by largest remainder (18 + 1.6 + 0.4 -> 18, 2, 0), and the 2-image class keeps one
    assert class_quotas([90, 8, 2], 0.2) == [18, 2, 1]
    assert per_class == [18, 2, 1]
    assert sorted(train + val) == sorted(items)
    assert split_validation(items, 0.2, seed=0) == (train, val)  # seeded: the same split again
    assert split_validation(items, 0.2, seed=1) != (train, val)


def test_no_group_lands_on_both_sides_of_the_validation_split():
    # 40 "patients" with 1-5 photos each, labels per patient
    rng = np.random.default_rng(0)
    items, groups = [], {}
    for g in range(40):
        for k in range(int(rng.integers(1, 6))):
            path = f"p{g}/{k}.png"
            items.append((path, g % 3))
            groups[path] = f"p{g}"
    for seed in range(3):
        train, val = split_validation(items, 0.25, seed=seed, groups=groups)
        assert {groups[p] for p, _ in train}.isdisjoint({groups[p] for p, _ in val})
        assert {t for _, t in val} == {0, 1, 2}  # every class still in validation
        assert 0.15 < len(val) / len(items) < 0.35


def test_group_by_keeps_the_photos_of_one_object_together(tmp_path):
    for obj in range(6):
        for c in ("a", "b"):
            _images(tmp_path / c, 3, seed=obj, prefix=f"obj{obj}{c}_")
    dm = ImageFolderDataModule(str(tmp_path), img_size=12, num_workers=0, group_by=r"(obj\d+)", val_fraction=0.3)
    obj = lambda p: Path(p).name[:4]  # noqa: E731
    assert {obj(p) for p, _ in dm.samples["train"]}.isdisjoint({obj(p) for p, _ in dm.samples["val"]})
    with pytest.raises(DataError, match=r"data.group_by='zzz' matches none of the 36 paths"):
        ImageFolderDataModule(str(tmp_path), img_size=12, num_workers=0, group_by="zzz")


def test_a_photo_with_an_exif_orientation_reads_upright(tmp_path):
    """A phone's photo: pixels stored as the sensor read them, Orientation 6 (turn 90 degrees clockwise to view)."""
    rng = np.random.default_rng(0)
    upright = Image.fromarray(rng.integers(0, 256, (30, 20, 3), dtype=np.uint8))  # 20 wide, 30 high
    upright.save(tmp_path / "upright.png")
    stored = upright.transpose(Image.Transpose.ROTATE_90)  # what the sensor wrote: 30 wide, 20 high
    exif = Image.Exif()
    exif[0x0112] = 6
    stored.save(tmp_path / "phone.png", exif=exif)
    assert Image.open(tmp_path / "phone.png").size == (30, 20)
    assert np.array_equal(
        np.asarray(load_image(tmp_path / "phone.png")), np.asarray(load_image(tmp_path / "upright.png"))
    )


def test_fit_from_a_labels_file_scores_its_test_split_once_and_saves_the_split(in_tmp, capsys):
    """`vit-train fit --data.root R --data.labels F` (the planned folder recipe): the test rows are scored once at the
    end (printed, test_metrics.json, TensorBoard test/), split.csv reads back as the same split, and `vit-train test`
    scores the test split."""
    import json

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import train

    rows = ["image,class,split"]
    for c in range(3):
        for i, path in enumerate(_images(in_tmp / "imgs" / f"batch{c}", 12, seed=c)):
            rows.append(f"{path.relative_to(in_tmp / 'imgs')},k{c},{'test' if i >= 9 else ''}")
    _csv(in_tmp / "labels.csv", "\n".join(rows) + "\n")
    quick = ["--trainer.max_epochs", "1", "--data.init_args.num_workers", "0", "--model.arch.depth", "1"]
    quick += ["--trainer.enable_progress_bar", "false"]
    train.main(["fit", "--data.root", "imgs", "--data.labels", "labels.csv", *quick])
    out = capsys.readouterr().out
    assert "test split (9 images, scored once, used to choose nothing): accuracy" in out
    logs = in_tmp / "logs" / "folder" / "version_0"
    metrics = json.loads((logs / "test_metrics.json").read_text())
    assert metrics["images"] == 9 and 0 <= metrics["acc"] <= 1
    events = EventAccumulator(str(logs)).Reload()
    assert "test/acc" in events.Tags()["scalars"]
    again = list_data(in_tmp / "imgs", labels=logs / "split.csv")
    dm = ImageFolderDataModule(str(in_tmp / "imgs"), labels=str(in_tmp / "labels.csv"), img_size=12, num_workers=0)
    assert {s: sorted(v) for s, v in again.splits.items()} == {s: sorted(v) for s, v in dm.samples.items()}
    cli = train.main(
        [
            "test",
            "--config",
            str(logs / "config.yaml"),
            "--ckpt_path",
            metrics["checkpoint"],
            "--trainer.logger",
            "false",
        ]
    )
    assert cli.trainer.callback_metrics["test/acc"].item() == pytest.approx(metrics["acc"])


def _soft_folder(root: Path) -> Path:
    """12 images a probability of being defective each (ELPV's 0, 1/3, 2/3, 1) in a flat folder and a labels file."""
    probs = [0.0, 1 / 3, 2 / 3, 1.0] * 3
    files = _images(root / "cells", len(probs), 0)
    rows = ["path,probability"] + [f"cells/{f.name},{p}" for f, p in zip(files, probs)]
    return _csv(root / "labels.csv", "\n".join(rows) + "\n")


def test_a_probability_per_image_trains_as_soft_targets_and_scores_against_the_thresholded_label(tmp_path):
    labels = _soft_folder(tmp_path)
    listing = list_data(tmp_path, labels=labels)
    assert listing.class_names == ["0", "1"] and "holds probabilities" in listing.found
    hard = dict(listing.splits["train"])
    for path, (q0, q1) in listing.soft.items():
        assert q0 + q1 == pytest.approx(1.0) and hard[path] == int(q1 >= 0.5)
    dm = ImageFolderDataModule(str(tmp_path), labels=str(labels), img_size=12, num_workers=0, batch_size=4)
    assert dm.soft_labels
    x, y = next(iter(dm.train_dataloader()))
    assert y.dtype == torch.float32 and y.shape == (4, 2)  # the training loss's targets: probabilities
    assert set(torch.round(y[:, 1] * 3).tolist()) <= {0.0, 1.0, 2.0, 3.0}
    _, y_val = next(iter(dm.val_dataloader()))
    assert y_val.dtype == torch.long  # validation: the thresholded label, as every metric reads it
    assert dm.soft_targets["val"].argmax(-1).tolist() == dm.memory["val"][1].tolist()
    streamed = ImageFolderDataModule(str(tmp_path), labels=str(labels), img_size=12, num_workers=0, in_memory=False)
    streamed.setup("fit")
    assert streamed.train_set[0][1].shape == (2,)
    hard_dm = ImageFolderDataModule(str(tmp_path), labels=str(labels), img_size=12, num_workers=0, soft_labels=False)
    assert not hard_dm.soft_labels and next(iter(hard_dm.train_dataloader()))[1].dtype == torch.long


def test_several_label_columns_are_a_distribution_or_flags_per_class(tmp_path):
    files = _images(tmp_path, 6, 0)
    dist = [(0.5, 0.25, 0.25), (0.0, 1.0, 0.0), (0.1, 0.1, 0.8)] * 2
    rows = ["path,cat,dog,fox"] + [f"{f.name},{a},{b},{c}" for f, (a, b, c) in zip(files, dist)]
    listing = list_data(tmp_path, labels=_csv(tmp_path / "p.csv", "\n".join(rows) + "\n"), label_column="cat,dog,fox")
    assert listing.class_names == ["cat", "dog", "fox"]  # the columns' order, not sorted
    assert listing.soft[str(files[0])] == (0.5, 0.25, 0.25) and "a distribution" in listing.found
    assert [t for _, t in listing.splits["train"]] == [0, 1, 2] * 2  # the likeliest class
    dm = ImageFolderDataModule(str(tmp_path), labels=str(tmp_path / "p.csv"), label_column="cat,dog,fox", img_size=12)
    assert dm.soft_labels and dm.soft_targets["train"].shape[1] == 3
    flags = [(1, 0, 1), (0, 1, 0), (1, 1, 0)] * 2  # several labels an image
    rows = ["path,cat,dog,fox"] + [f"{f.name},{a},{b},{c}" for f, (a, b, c) in zip(files, flags)]
    listing = list_data(tmp_path, labels=_csv(tmp_path / "f.csv", "\n".join(rows) + "\n"), label_column="cat,dog,fox")
    assert listing.multi[str(files[0])] == (0, 2) and listing.multi[str(files[2])] == (0, 1) and not listing.soft
    rows[3] = f"{files[2].name},0.5,0.2,0.2"
    with pytest.raises(DataError, match=r"f.csv:4: '0.5,0.2,0.2' in columns \['cat', 'dog', 'fox'\] sums to 0.9"):
        list_data(tmp_path, labels=_csv(tmp_path / "f.csv", "\n".join(rows) + "\n"), label_column="cat,dog,fox")
    with pytest.raises(DataError, match=r"no column 'wolf' \(--data.label_column\)"):
        list_data(tmp_path, labels=tmp_path / "f.csv", label_column="cat,wolf")


@pytest.mark.parametrize(
    "header, values, read",
    [
        ("path,probability", [0.0, 1 / 3, 2 / 3, 1.0, 0.5, 0.25], {}),
        ("path,a,b", [(0.2, 0.8), (1 / 3, 2 / 3)] * 3, {"label_column": "a,b"}),
        ("path,x y,b,c", [(1, 0, 1), (0, 1, 0), (1, 1, 0)] * 2, {"label_column": "x y,b,c"}),
        ("path,labels", ["a;b c", "b c", "a;d"] * 2, {"label_delimiter": ";"}),
    ],
    ids=["probability", "distribution", "flags", "list"],
)
def test_split_csv_reads_back_as_the_same_split_and_targets(tmp_path, header, values, read):
    from vit.data.val_split import write_split

    files = _images(tmp_path, 6, 0)
    cells = [v if isinstance(v, (str, float)) else ",".join(map(str, v)) for v in values]
    labels = _csv(tmp_path / "l.csv", "\n".join([header, *(f"{f.name},{c}" for f, c in zip(files, cells))]) + "\n")
    listing = list_data(tmp_path, labels=labels, **read)
    train, val = split_validation(listing.splits["train"], 0.34, 0, multi=listing.multi)
    write_split(tmp_path / "split.csv", tmp_path, {"train": train, "val": val}, listing)
    back = list_data(tmp_path, labels=tmp_path / "split.csv", **read)
    assert back.splits == {"train": train, "val": val} and back.class_names == listing.class_names
    assert back.soft == listing.soft and back.multi == listing.multi


def test_soft_targets_mix_as_timms_mixup_mixes_one_hot_targets():
    from timm.data import Mixup

    from vit.training.mixing import mix_soft

    torch.manual_seed(0)
    x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 2, 1, 1])
    mixup = Mixup(mixup_alpha=1.0, label_smoothing=0.1, num_classes=3)
    torch.manual_seed(1), np.random.seed(1)
    x_ref, y_ref = mixup(x.clone(), y)
    torch.manual_seed(1), np.random.seed(1)
    x_soft, y_soft = mix_soft(mixup, x.clone(), torch.nn.functional.one_hot(y, 3).float())
    torch.testing.assert_close(x_soft, x_ref)
    torch.testing.assert_close(y_soft, y_ref)


def test_fit_on_soft_labels_prints_brier_and_log_loss_against_them(in_tmp, capsys):
    import train

    _soft_folder(in_tmp)
    quick = ["--trainer.max_epochs", "1", "--data.init_args.num_workers", "0", "--model.arch.depth", "1"]
    quick += ["--trainer.enable_progress_bar", "false", "--trainer.logger", "false", "--data.val_fraction", "0.34"]
    cli = train.main(["fit", "--data.root", ".", "--data.labels", "labels.csv", *quick])
    assert cli.datamodule.soft_labels
    assert "against the validation images' label probabilities: Brier" in capsys.readouterr().out


@pytest.mark.parametrize(
    "make, says",
    [
        (lambda r: _csv(r / "labels.csv", "path,label\nnope.png,a\n"), r"labels.csv: no usable training row"),
        (lambda r: (_layout(r / "imgs", {"train": 2, "test": 2}), _images(r / "imgs" / "cat", 2, 0)), r"beside other"),
    ],
    ids=["labels-file", "layout"],
)
def test_bad_data_stops_fit_in_one_line_before_anything_is_written(in_tmp, make, says):
    import train

    (in_tmp / "imgs").mkdir()
    make(in_tmp)
    labels = ["--data.labels", "labels.csv"] if (in_tmp / "labels.csv").exists() else []
    with pytest.raises(SystemExit) as e:
        train.main(["fit", "--data.root", "imgs", *labels])
    assert str(e.value).startswith("error: ") and "\n" not in str(e.value)
    assert re.search(says, str(e.value))
    assert not (in_tmp / "logs").exists() and not (in_tmp / "checkpoints").exists()


def test_vit_predict_answers_a_phones_exif_rotated_jpeg_as_its_upright_copy(smoke_ckpt, tmp_path, capsys):
    import json

    from vit.commands.predict import main as predict_main
    from vit.data.digits import DigitsDataModule

    digit = DigitsDataModule().memory["val"][0][7].permute(1, 2, 0).numpy()  # (32, 32, 3) uint8
    upright = Image.fromarray(digit).resize((64, 96), Image.BILINEAR)  # not square: a turn changes the crop too
    upright.save(tmp_path / "upright.jpg", quality=95)
    stored = upright.transpose(Image.Transpose.ROTATE_90)  # as the sensor wrote it, Orientation 6 to view upright
    exif = Image.Exif()
    exif[0x0112] = 6
    stored.save(tmp_path / "phone.jpg", quality=95, exif=exif)
    stored.save(tmp_path / "phone_without_exif.jpg", quality=95)
    capsys.readouterr()
    files = [str(tmp_path / f) for f in ("upright.jpg", "phone.jpg", "phone_without_exif.jpg")]
    assert predict_main(["--ckpt", str(smoke_ckpt), "--format", "json", "--topk", "10", *files]) == 0
    probs = [{d["label"]: d["prob"] for d in r["predictions"]} for r in json.loads(capsys.readouterr().out)]
    gap = lambda a, b: max(abs(a[k] - b[k]) for k in a)  # noqa: E731
    # the phone's photo, turned upright, answers as the upright file (JPEG's own noise apart); without EXIF the
    # same pixels answer otherwise (the smoke model is barely trained: its probabilities all lie near 0.1)
    assert gap(probs[1], probs[0]) < gap(probs[2], probs[0]) / 5


def test_the_labels_file_docs_data_md_works_through_reads_as_it_says(tmp_path):
    """docs/data.md's worked labels file, written with images at its paths: the splits and groups it names."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "data.md").read_text()
    csv_text = re.search(r"```csv\n(.*?)```", doc, re.S).group(1)
    rows = [line.split(",") for line in csv_text.splitlines()[1:]]
    assert len(rows) >= 6
    for path, *_ in rows:
        _images(tmp_path / Path(path).parent, 1, seed=len(path))
        (tmp_path / Path(path).parent / f"{len(path)}-0.png").rename(tmp_path / path)
    (tmp_path / "labels.csv").write_text(csv_text)
    listing = list_data(tmp_path, labels=tmp_path / "labels.csv")
    assert listing.class_names == sorted({r[1] for r in rows})
    want = {s: sorted(str(tmp_path / r[0]) for r in rows if r[2] == s) for s in ("train", "val", "test")}
    assert {s: sorted(p for p, _ in items) for s, items in listing.splits.items()} == want
    assert listing.groups[str(tmp_path / rows[0][0])] == rows[0][3]
