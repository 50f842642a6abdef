"""The project tells what it does, not how it came to be: no line of the docs, the code, the benchmarks or the tests
names a round or a session of the work, or one of the project's issue numbers (history belongs in git log); and the
README, docs/ and configs/, read as one text (so a phrase wrapped over two lines is still found), hold no commit
hash, clock time, first person or account of how the work went ("since then", "no longer", "not adopted",
"re-measured", "re-timed", "the first try", "the old plan", "the issue")."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ORDINALS = "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|fourteenth"
HISTORY = re.compile(
    # (written so that no line here matches itself: [ ] and ['] stand for a space and an apostrophe)
    rf"\b(?:{ORDINALS}|this|that|previous|last|earlier|next)[ ](?:session|round[ ]of[ ]work)s?\b"
    r"|(?<!GitHub )\bissue #?\d+|\bthe[ ]issue[']s\b|\bround[ ]of[ ]work\b|\bsessions?[ ](?:that|which)[ ]wrote\b",
    re.I,
)
SUFFIXES = (".md", ".py", ".yaml", ".toml", ".txt", ".cfg", ".html")
# Narration in the reference docs (written so that no line here matches itself: [ ] stands for a space)
NARRATION = re.compile(
    r"(?<![\w/.-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w/-])"  # a commit hash
    r"|\b(?:[01]?\d|2[0-3]):[0-5]\d(?!\d)"  # a clock time
    r"|(?<!\d )\bI(?:'m|'ve|'d|'ll)?\s+[a-z]|\b(?:[Mm]y|[Ww]e|[Oo]urs?)\s"  # first person ("0.7 I" is a matrix)
    r"|\b(?:since\s+then|no\s+longer|not\s+adopted|re-(?:measured|timed)|the\s+first\s+try|the\s+(?:old|new)\s+plan|the\s+issue)\b",
)


def narration(files: list[Path]) -> list[str]:
    """`file:line: words` for each marker of NARRATION, found in the file's text with its line breaks read as spaces."""
    out = []
    for f in files:
        text = f.read_text(errors="ignore")
        flat = re.sub(r"\s", " ", text)  # one character for one: offsets stay the file's
        for m in NARRATION.finditer(flat):
            line = text.count("\n", 0, m.start()) + 1
            out.append(f"{f.relative_to(ROOT) if f.is_relative_to(ROOT) else f.name}:{line}: {m.group(0).strip()}")
    return out


def history_lines(files: list[Path]) -> list[str]:
    out = []
    for f in files:
        for i, line in enumerate(f.read_text(errors="ignore").splitlines(), 1):
            if HISTORY.search(line):
                out.append(f"{f.relative_to(ROOT) if f.is_relative_to(ROOT) else f.name}:{i}: {line.strip()[:100]}")
    return out


def test_no_line_tells_the_history_of_the_work(tmp_path):
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    files = [
        ROOT / f for f in tracked if (f.endswith(SUFFIXES) or f == "Makefile") and not f.startswith("tests/legacy/")
    ]
    assert history_lines([f for f in files if f.is_file()]) == []
    # the check finds each kind, and leaves a test session, a benchmark round and an upstream issue alone
    # (the samples are written from parts, so that this file itself holds no such line)
    session, issue = "ses" + "sion", "iss" + "ue"
    (tmp_path / "a.md").write_text(
        f"as the eighth {session} found\nthe {issue}'s target\nsee {issue} 41\nfixed this {session}\n"
        f"one pytest {session}\neach round of the bench\nlitdata's GitHub {issue} 797\n"
    )
    assert [line.split(": ", 1)[0] for line in history_lines([tmp_path / "a.md"])] == [
        "a.md:1",
        "a.md:2",
        "a.md:3",
        "a.md:4",
    ]


def test_the_readme_the_docs_and_the_configs_state_rules_not_the_story_of_the_work(tmp_path):
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "configs").rglob("*.yaml"))]
    assert len(docs) > 10
    assert narration(docs) == []
    # each kind is found, across a line break too; a matrix named I, a port and a plain number are left alone
    since, issue = "since", "iss" + "ue"
    (tmp_path / "b.md").write_text(
        f"measured at 3f2a1b9\nfrom 07:50 to 08:41\nso I made some\n{since}\nthen the plan\nnot\nadopted\n"
        f"the {issue} asked\n0.7 Z + 0.7 I and more\nHOST:29500, 40000000 pixels\n"
    )
    found = narration([tmp_path / "b.md"])
    assert [line.split(": ")[0] for line in found] == ["b.md:1", "b.md:2", "b.md:2", "b.md:3", "b.md:4", "b.md:6",
                                                       "b.md:8"]  # fmt: skip


# How the work went, told in a code comment (written so that no line here matches itself: [ ] stands for a space)
COMMENT_HISTORY = re.compile(
    r"\b(?:not[ ]adopted|was[ ]adopted|the[ ]old[ ]rule|the[ ]new[ ]rule|was[ ]dropped|were[ ]dropped|fixed[ ]before"
    r"[ ]they[ ]ran|screened[ ]on|of[ ]its[ ]day|this[ ]session|the[ ]round[ ]before|before[ ]the[ ]fix"
    r"|20\d\d-\d\d-\d\d)\b",
    re.I,
)


def comment_history(files: list[Path]) -> list[str]:
    """`file:line` for each comment (the text after `#`) that tells how the work went rather than why the code is so."""
    return [
        f"{f.relative_to(ROOT) if f.is_relative_to(ROOT) else f.name}:{i}"
        for f in files
        for i, line in enumerate(f.read_text().splitlines(), 1)
        if "#" in line and COMMENT_HISTORY.search(line.split("#", 1)[1])
    ]


def test_comments_in_the_package_and_the_benchmarks_say_why_in_the_present_tense(tmp_path):
    files = [*sorted((ROOT / "vit").rglob("*.py")), *sorted((ROOT / "bench").rglob("*.py"))]
    assert comment_history(files) == []
    old = "the old" + " rule"
    (tmp_path / "c.py").write_text(f"x = 1  # {old} was worse\ny = 2  # faster: one kernel, not three\n")
    assert comment_history([tmp_path / "c.py"]) == ["c.py:1"]
