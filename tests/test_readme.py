"""The README's commands are real: every command line in its shell code blocks parses with the parser of the command
it names (`--print_config` for training, the argparse parser of the others), and its Python blocks compile. A
command this test does not know fails it, so a new kind of command in the README needs a line here."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import train
from vit.commands import attention, export, predict, serve, streaming
from vit.commands import eval as evaluate

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
EXTERNAL = ("tensorboard", "pip", "git", "curl")  # other tools' commands, shown for convenience


def code_blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, re.S)


def commands() -> list[str]:
    """Each command of the bash blocks: comments dropped, continuation lines joined."""
    out = []
    for block in code_blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def train_argv(words: list[str]) -> list[str] | None:
    """The vit-train argv of a training command, or None if it is not one."""
    if words[:2] == ["python", "train.py"] or words[:1] == ["vit-train"]:
        return words[2:] if words[0] == "python" else words[1:]
    if words[:2] == ["make", "train"]:
        opts = dict(w.split("=", 1) for w in words[2:])
        argv = ["fit", "--config", opts.get("CONFIG", "configs/digits.yaml"), *shlex.split(opts.get("ARGS", ""))]
        return argv + (["--ckpt_path", "last"] if opts.get("RESUME") else [])
    return None


PARSERS = {  # longest prefixes first: the first match parses
    ("vit-attention", "faithfulness"): attention.build_faithfulness_parser,
    ("vit-predict",): predict.build_parser,
    ("vit-eval",): evaluate.build_parser,
    ("python", "predict.py"): predict.build_parser,
    ("vit-export",): export.build_parser,
    ("vit-attention",): attention.build_parser,
    ("vit-serve",): serve.build_parser,
    ("python", "-m", "vit.commands.streaming"): streaming.build_parser,
}


def test_the_readme_shows_commands():
    assert len(commands()) >= 15


@pytest.mark.parametrize("line", commands())
def test_each_readme_command_parses(line, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing a parse might write lands in the repository
    words = shlex.split(line)
    if words[0] in EXTERNAL:
        return
    if words == ["make", "test"]:
        assert subprocess.run(["make", "-n", "-C", str(ROOT), "test"], capture_output=True).returncode == 0
        return
    argv = train_argv(words)
    if argv is not None:
        for a, b in zip(argv, argv[1:]):  # a run's saved plan.yaml: a stand-in full config (the format: test_plan.py)
            if a == "--config" and b.startswith("logs/"):
                (tmp_path / b).parent.mkdir(parents=True, exist_ok=True)
                (tmp_path / b).write_text((ROOT / "configs" / "smoke.yaml").read_text())
        with pytest.raises(SystemExit) as e:
            train.main([*argv, "--print_config"])
        assert e.value.code in (0, None), e.value.code
        assert "model:" in capsys.readouterr().out
        return
    for prefix, parser in PARSERS.items():
        if tuple(words[: len(prefix)]) == prefix:
            parser().parse_args(words[len(prefix) :])  # argparse exits 2 on an unknown flag or a bad choice
            return
    if words[:2] == ["python", "bench"] or (words[0] == "python" and words[1].startswith("bench/")):
        run = subprocess.run([sys.executable, *words[1:], "--help"], cwd=ROOT, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr[-1000:]
        return
    pytest.fail(f"README command not checked by this test: {line}")


def python_snippets() -> list[str]:
    """The README's Python: its python blocks, and the inline code that calls something (`to_timm(from_timm(...))`)."""
    return code_blocks("python") + re.findall(r"`([A-Za-z_][\w.]*\(.*?\))`", README)


def test_readme_python_compiles():
    snippets = python_snippets()
    assert snippets  # the README shows Python (the timm round trip): a change that breaks this list fails here
    for i, code in enumerate(snippets):
        compile(code, f"README python snippet {i}", "exec")


def test_readme_is_short():
    """250 lines of at most 250 characters: a table row that needs more belongs in docs/."""
    assert len(README.splitlines()) <= 250
    wide = [(i + 1, len(line)) for i, line in enumerate(README.splitlines()) if len(line) > 250]
    assert not wide, wide


def test_the_readme_names_no_run_folder_that_is_only_right_the_first_time():
    """`version_0` is the first run's folder only; commands take a run's folder or name (`--ckpt checkpoints/folder`:
    its newest best checkpoint) or say `version_N`."""
    assert "version_0" not in README


COMMAND_PARSERS = {
    "vit-predict": predict.build_parser,
    "vit-eval": evaluate.build_parser,
    "vit-export": export.build_parser,
    "vit-serve": serve.build_parser,
    "vit-attention": attention.build_parser,
    "vit-attention faithfulness": attention.build_faithfulness_parser,
}


def flag_rows() -> list[tuple[list[str], list[str]]]:
    """The README's flag table: (flags named in the flag and meaning cells, the commands of the last cell) per row."""
    section = README.split("## Flags the commands share", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in section.splitlines() if r.startswith("| `")]
    out = []
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        out.append((re.findall(r"--[a-z][a-z_-]*", " ".join(cells[:2])), cells[-1].split(", ")))
    return out


@pytest.mark.parametrize("flags,commands", flag_rows(), ids=lambda v: v[0] if isinstance(v[0], str) else None)
def test_each_flag_in_the_readme_table_is_what_the_commands_it_names_accept(flags, commands):
    """One spelling per concept across the vit-* commands: every row's flags (and aliases) are accepted by every
    command the row names, with the same meaning of the value where the row gives the choices."""
    assert flags and commands
    for command in commands:
        parser = COMMAND_PARSERS[command]()
        known = {o: a for a in parser._actions for o in a.option_strings}
        for flag in flags:
            assert flag in known, f"{command} has no {flag}"
    assert len(flag_rows()) >= 8


def test_the_format_values_in_the_flag_table_are_each_commands_choices():
    """The `--format` row's values are each command's choices (the table said `csv` for vit-attention faithfulness,
    which has none); the row's flags and commands are checked above."""
    section = README.split("## Flags the commands share", 1)[1].split("\n## ", 1)[0]
    row = next(r for r in section.splitlines() if r.startswith("| `--format"))
    values, names = [c.strip() for c in row.strip("|").split(" | ")][1:]
    for name in names.split(", "):
        said = {"vit-attention faithfulness": "faithfulness: ", "vit-export": "export: "}.get(name, "")
        shown = values.split(said, 1)[1] if said and said in values else values
        listed = set(re.findall(r"`([^`]+)`", shown)[0].replace("\\|", "|").split("|"))
        assert listed == set(COMMAND_PARSERS[name]()._option_string_actions["--format"].choices), name
