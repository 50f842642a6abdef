"""The card's third use, looked at where a user looks: TensorBoard's own page, served from a run's logs, shows the
attention maps the AttentionMapCallback wrote (headless Chromium, driven over the DevTools protocol)."""

from pathlib import Path

from browser import chromium, needs_chromium
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "docs" / "tensorboard_maps.png"


@needs_chromium
def test_tensorboard_shows_the_attention_maps_of_a_run(smoke_run, tmp_path):
    from browser import TB_ATTENTION_IMAGES, Browser, tensorboard

    with tensorboard(smoke_run.root / "logs") as url, Browser(chromium(), tmp_path) as page:
        page.open(f"{url}/#images")
        shown = page.wait_for(TB_ATTENTION_IMAGES, timeout=120)  # the cards of attention/* tags, their images drawn
        assert "attention/relevance" in shown["tags"] and "attention/rollout" in shown["tags"]
        assert shown["drawn"] >= 2 and min(shown["widths"]) >= 64
        shot = page.screenshot(tmp_path / "tensorboard.png")
    assert Image.open(shot).size[0] >= 1000


def test_the_docs_show_tensorboard_s_page_with_the_maps():
    """docs/attention.md shows a screenshot of TensorBoard's images dashboard over a run's logs, made with the same
    helpers (`python bench/tensorboard_page.py LOGDIR docs/tensorboard_maps.png`): a real page, not a drawing of one."""
    assert "tensorboard_maps.png" in (ROOT / "docs" / "attention.md").read_text()
    image = Image.open(SCREENSHOT)
    assert image.size[0] >= 1000 and image.size[1] >= 500
    colours = image.convert("RGB").resize((100, 60)).getcolors(6000)
    assert colours is not None and len(colours) > 50  # the maps' colours, not a blank or single-colour page
