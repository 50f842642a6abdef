"""The docs name files that exist: every repository path (vit/, configs/, bench/, docs/, tests/) in the README and in
docs/*.md, and every relative link, is there (globs match something)."""

import glob
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATH = re.compile(r"(?<![\w/.-])((?:vit|configs|bench|docs|tests)/[\w./*-]*[\w*])")
LINK = re.compile(r"\]\(([^)#\s]+)")
OUTPUTS = {"bench/gpu.jsonl"}  # written by a benchmark when it runs (bench/gpu.py on a GPU), named as its output


def missing(doc: Path) -> list[str]:
    text = doc.read_text()
    named = set(PATH.findall(text)) | {
        p for p in LINK.findall(text) if not p.startswith(("http:", "https:", "mailto:"))
    }
    out = []
    for p in sorted(named - OUTPUTS):
        target = ROOT / p if PATH.fullmatch(p) else doc.parent / p  # links are relative to their document
        if not (target.exists() or glob.glob(str(target))):
            out.append(p)
    return out


def test_every_file_the_readme_and_the_docs_name_exists(tmp_path):
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(ROOT.glob("bench/**/*.md"))]
    assert {str(d.relative_to(ROOT)): missing(d) for d in docs if missing(d)} == {}
    # the check finds a path that is not there, and a broken link
    (tmp_path / "x.md").write_text("see `vit/nope.py` and [this](gone.md), [that](x.md), `configs/variants/*.yaml`\n")
    assert missing(tmp_path / "x.md") == ["gone.md", "vit/nope.py"]


def test_the_errors_docs_reliability_quotes_are_the_codes():
    """Each `error: FOLDER...` that docs/reliability.md quotes for a user's images is written by the code: its words
    between placeholders (FOLDER, '...', quoted values) appear in vit/ (they had drifted from vit/data/folder.py's)."""
    doc = (ROOT / "docs" / "reliability.md").read_text()
    source = "\n".join(p.read_text() for p in (ROOT / "vit").rglob("*.py"))
    quoted = [q for q in re.findall(r"`error: ([^`]+)`", doc) if "FOLDER" in q]
    assert len(quoted) >= 3
    missing = []
    for q in quoted:
        # the fixed words: split at placeholders (upper-case names, ..., quoted or numeric values, brackets)
        parts = re.split(r"[A-Z]{3,}[\w/]*|\.\.\.|'[^']*'|\[[^\]]*\]|\([^)]*\)|\b\d+\b|\S+\.(?:py|ckpt|yaml)|=\S+", q)
        for part in (p.strip(" :;,./") for p in parts):
            if len(part) >= 12 and part not in source:
                missing.append((q[:60], part))
    assert missing == []


def test_the_readme_links_every_doc_in_its_reading_order():
    readme = (ROOT / "README.md").read_text()
    order = readme.split("## Read next", 1)[1].split("\n## ", 1)[0]
    linked = set(re.findall(r"\]\((docs/[\w-]+\.md)\)", order))
    docs = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert len(docs) >= 8 and linked == docs


QUOTED_SECTION = re.compile(r'docs/(\w+\.md)(?:, | \()"([^"\n]{2,80}(?:\n\s*#\s*[^"\n]{1,80})?)"')


def test_a_section_of_a_doc_quoted_by_name_is_in_that_doc():
    """`docs/recipes.md, "Real photos"` in code, configs or docs names words the doc holds (a heading or a bold
    term), so that a rewrite of a doc cannot leave a reference dangling."""
    sources = [*ROOT.glob("vit/**/*.py"), *ROOT.glob("configs/**/*.yaml"), *ROOT.glob("docs/*.md"), ROOT / "README.md",
               *ROOT.glob("tests/**/*.py"), *ROOT.glob("bench/**/*.py")]  # fmt: skip
    quoted = {(doc, name) for f in sources for doc, name in QUOTED_SECTION.findall(f.read_text(errors="ignore"))}
    assert len(quoted) >= 10
    texts = {doc: " ".join((ROOT / "docs" / doc).read_text().split()).lower() for doc, _ in quoted}
    words = {(doc, name): " ".join(name.replace("#", " ").split()).lower() for doc, name in quoted}  # a comment's wrap
    assert [key for key in sorted(quoted) if words[key] not in texts[key[0]]] == []
