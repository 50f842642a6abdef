"""The report's pictures of single images: the worst-scored images with the relevance of their true and predicted
class (top_losses), and the files a label-issue search flagged (label_issue_gallery)."""

from pathlib import Path

import torch

from vit.evaluation.attention_maps import denormalize, overlay_batch, relevance
from vit.evaluation.report import png_bytes, top_losses_figure
from vit.model.record import CheckpointRecord


def top_losses(model, scored, rows, classes, record: CheckpointRecord, device, ids: list[str]) -> bytes:
    """top_losses.png: each of the worst images with the relevance maps of its true and of its predicted class."""
    x = scored.worst_images.to(device)
    picked = scored.worst_rows
    true, pred = rows["true"][picked], rows["pred"][picked]
    images = denormalize(x.float(), record.mean, record.std).cpu()
    maps_true = overlay_batch(images, relevance(model, x, true.to(device))[0])
    maps_pred = overlay_batch(images, relevance(model, x, pred.to(device))[0])
    captions = [
        f"{Path(ids[r]).name[:22]}\ntrue {classes[t]}, pred {classes[p]} {rows['prob'][r]:.2f}"
        for r, t, p in zip(picked.tolist(), true.tolist(), pred.tolist())
    ]
    return png_bytes(top_losses_figure(images, maps_true, maps_pred, captions))


def label_issue_gallery(record: CheckpointRecord, show: int = 16) -> tuple[bytes, int] | None:
    """label_issues.png from the label_issues.csv of the checkpoint's run (`--find_label_issues true`), when that file
    is there: the files most likely mislabelled, with their given and suggested class; and how many it lists."""
    from vit.data.images import image_at, read_image
    from vit.evaluation.label_issues import read_label_issues
    from vit.evaluation.report import label_issues_figure

    path = record.label_issues
    if path is None or not Path(path).is_file():
        return None
    rows = read_label_issues(Path(path))
    pictures, captions = [], []
    for r in rows:
        if len(pictures) == show:
            break
        try:
            img = image_at(read_image(r["path"], record.in_chans), record.img_size)
        except Exception:  # a file moved or deleted since training: shown by the others
            continue
        pictures.append(img.float() / 255 if img.dtype == torch.uint8 else img)
        captions.append(
            f"{Path(r['path']).name[:22]}\ngiven {r['given']}, suggested {r['suggested']} ({float(r['score']):.2f})"
        )
    if not pictures:
        return None
    images = torch.stack(pictures)
    images = images.mean(1, keepdim=True) if images.shape[1] not in (1, 3) else images  # bands: their mean, grey
    images = images.expand(-1, 3, -1, -1) if images.shape[1] == 1 else images
    return png_bytes(label_issues_figure(images, captions, path)), len(rows)
