"""The project tells what it does, not how it came to be: no line of the docs, the code, the benchmarks or the tests
names a round or a session of the work, or one of the project's issue numbers (history belongs in git log)."""

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
