"""Every script under bench/ imports, one with an argument parser answers `--help`, and none reaches into the
package's private names: the commands its docs give stay runnable."""

import ast
import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p for p in (ROOT / "bench").rglob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_bench_script_imports_and_one_with_a_parser_answers_help(script, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(script.parent))  # scripts import their neighbours by name
    text = script.read_text()
    if '__name__ == "__main__"' in text:
        runpy.run_path(str(script), run_name="bench_script")  # imports, its main guarded
    if "ArgumentParser" not in text:
        return  # reads sys.argv itself: its docstring gives the command
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    with pytest.raises(SystemExit) as ended:
        runpy.run_path(str(script), run_name="__main__")
    assert ended.value.code in (0, None), capsys.readouterr().err[-500:]
    assert "usage:" in capsys.readouterr().out.lower()


def test_no_bench_script_imports_a_private_name_of_the_package():
    private = [
        f"{p.relative_to(ROOT)}: {alias.name}"
        for p in SCRIPTS
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vit")
        for alias in node.names
        if alias.name.startswith("_")
    ]
    assert private == []
