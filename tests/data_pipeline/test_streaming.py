"""litdata round trip: a small folder optimized to chunks, streamed under 2-process DDP on CPU."""

import json

import lightning as L
import litdata  # noqa: F401  (pinned in requirements.txt: a missing one fails the file, it does not skip it)
import numpy as np
import pytest
import torch
from PIL import Image

from vit.commands.streaming import main
from vit.data.streaming import StreamingDataModule

N_PER_CLASS = 10


def _folder(root):
    """Images of one solid grey level each (10 * index): identifiable after any crop or flip."""
    index = 0
    for split, n in (("train", N_PER_CLASS), ("val", 2)):
        for c in ("a", "b"):
            (root / split / c).mkdir(parents=True)
            for i in range(n):
                level = 10 * index if split == "train" else 5
                Image.fromarray(np.full((20 + i, 24, 3), level, np.uint8)).save(root / split / c / f"{i}.png")
                index += split == "train"


class Recorder(L.LightningModule):
    """Writes the grey levels of the images each rank saw in its epoch."""

    def __init__(self, out, mean, std):
        super().__init__()
        self.out, self.seen = out, []
        self.mean, self.std = torch.tensor(mean)[:, None, None], torch.tensor(std)[:, None, None]
        self.w = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        raw = (x * self.std + self.mean) * 255  # back to pixel values
        self.seen += [round(v / 10) for v in raw.mean(dim=(1, 2, 3)).tolist()]
        return (self.w * x.mean()).sum()

    def on_train_epoch_end(self):
        (self.out / f"rank{self.global_rank}.json").write_text(json.dumps(self.seen))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_each_image_once_per_epoch_across_two_ddp_ranks(tmp_path):
    _folder(tmp_path / "imgs")
    assert main(["optimize", str(tmp_path / "imgs"), str(tmp_path / "chunks")]) == 0
    meta = json.loads((tmp_path / "chunks" / "vit_meta.json").read_text())
    assert meta["class_names"] == ["a", "b"]
    dm = StreamingDataModule(str(tmp_path / "chunks"), img_size=16, batch_size=2, num_workers=0, hflip=True)
    assert dm.num_classes == 2 and dm.mean == tuple(meta["mean"])
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_fork",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        use_distributed_sampler=False,  # litdata shards by rank itself
    )
    trainer.fit(Recorder(tmp_path, dm.mean, dm.std), datamodule=dm)
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert seen[0] and seen[1]  # both ranks read
    assert sorted(seen[0] + seen[1]) == list(range(2 * N_PER_CLASS))  # every image exactly once across the ranks


def test_a_missing_chunk_folder_is_one_line(tmp_path):
    from vit.data.transforms import DataError

    with pytest.raises(DataError, match="python -m vit.commands.streaming optimize"):
        StreamingDataModule(str(tmp_path / "nothing"))


def test_chunks_of_pickled_items_are_refused_unless_trusted(tmp_path):
    """litdata unpickles items it stored with its pickle serializer: such chunks from a stranger would run code."""
    from vit.data.transforms import DataError

    _folder(tmp_path / "imgs")
    assert main(["optimize", str(tmp_path / "imgs"), str(tmp_path / "chunks")]) == 0
    StreamingDataModule(str(tmp_path / "chunks"), num_workers=0)  # ours: bytes and ints
    index = tmp_path / "chunks" / "train" / "index.json"
    meta = json.loads(index.read_text())
    meta["config"]["data_format"] = ["pickle", "int", "int"]
    index.write_text(json.dumps(meta))
    with pytest.raises(DataError, match=r"train/index\.json: its items are pickles .*trust_pickles true"):
        StreamingDataModule(str(tmp_path / "chunks"), num_workers=0)
    StreamingDataModule(str(tmp_path / "chunks"), num_workers=0, trust_pickles=True)


def test_teardown_stops_the_persistent_workers_at_once(tmp_path):
    """litdata's loader and its iterator form a cycle: left to the collector, the iterator's queues could be closed
    before it asks its workers to exit, and each worker was waited for 5 s, then killed (a 10 s stall at some later
    garbage collection). Teardown stops them while the queues live."""
    _folder(tmp_path / "imgs")
    assert main(["optimize", str(tmp_path / "imgs"), str(tmp_path / "chunks")]) == 0
    dm = StreamingDataModule(str(tmp_path / "chunks"), img_size=16, batch_size=4, num_workers=2)
    loader = dm.train_dataloader()
    assert sum(len(y) for _, y in loader) == 2 * N_PER_CLASS  # one whole epoch: the workers persist after it
    workers = loader._iterator._workers
    assert all(w.is_alive() for w in workers)
    dm.teardown("fit")
    # the workers were told to exit while their queues lived: they are gone now, not in 5 s each
    assert not any(w.is_alive() for w in workers) and all(w.exitcode == 0 for w in workers)
    assert loader._iterator is None


def test_optimize_reads_the_folder_as_the_other_readers_do(tmp_path):
    """timm's split names (training/valid) and images in a subfolder of a class: the same listing as --data.root."""
    from vit.commands.streaming import main

    for split, n in (("training", 3), ("valid", 1)):
        for c in ("a", "b"):
            (tmp_path / "imgs" / split / c / "deeper").mkdir(parents=True)
            for i in range(n):
                Image.fromarray(np.full((16, 16, 3), 40 * i, np.uint8)).save(tmp_path / "imgs" / split / c / f"{i}.png")
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(tmp_path / "imgs" / "training" / "a" / "deeper" / "x.png")
    assert main(["optimize", str(tmp_path / "imgs"), str(tmp_path / "chunks")]) == 0
    meta = json.loads((tmp_path / "chunks" / "vit_meta.json").read_text())
    assert meta["class_names"] == ["a", "b"] and meta["class_counts"] == [4, 3]
    # and the same training statistics as the folder's DataModule at the same size (one channel_mean_std)
    from vit.data.folder import ImageFolderDataModule

    dm = ImageFolderDataModule(str(tmp_path / "imgs"), img_size=64, num_workers=0, in_chans=3)  # chunks are RGB
    dm.setup("fit")
    assert (list(dm.mean), list(dm.std)) == (meta["mean"], meta["std"])


def test_optimize_splits_a_folder_of_class_folders_and_names_a_missing_one(tmp_path, capsys):
    """The README's first layout, root/<class>/*: 20% of each class becomes val (it ended in a traceback: 'optimize
    needs root/train/<class>/ and root/val/<class>/'); a folder that is not there is one line, exit 2."""
    from vit.commands.streaming import main

    for c in ("a", "b"):
        (tmp_path / "imgs" / c).mkdir(parents=True)
        for i in range(5):
            Image.fromarray(np.full((16, 16, 3), 40 * i, np.uint8)).save(tmp_path / "imgs" / c / f"{i}.png")
    assert main(["optimize", str(tmp_path / "imgs"), str(tmp_path / "chunks")]) == 0
    meta = json.loads((tmp_path / "chunks" / "vit_meta.json").read_text())
    assert meta["class_names"] == ["a", "b"] and meta["class_counts"] == [4, 4]  # one of each class's 5 in val
    assert (tmp_path / "chunks" / "val").is_dir()
    capsys.readouterr()
    assert main(["optimize", str(tmp_path / "nope"), str(tmp_path / "c2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "nope" in err[0]
