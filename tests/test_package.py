"""The installable package: the wheel builds, installs into a fresh virtual environment without network, and its
console scripts run from a folder that is not the repository."""

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

# one worker runs this file under `make test` (--dist loadgroup): its module fixture is built once, not per worker
pytestmark = pytest.mark.xdist_group("package")

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ("vit-train", "vit-predict", "vit-export", "vit-attention", "vit-serve", "vit-eval")


def _run(args, cwd, timeout=300, pythonpath=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    if pythonpath:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh venv holding only our wheel; the dependencies are this environment's, seen through a .pth file (no
    network, no copies). pip checks the wheel's declared dependency ranges against them."""
    tmp = tmp_path_factory.mktemp("pkg")
    src = tmp / "src"  # build from a copy: setuptools writes build/ and *.egg-info next to the sources
    shutil.copytree(
        ROOT,
        src,
        ignore=lambda folder, names: (
            shutil.ignore_patterns(".git", ".venv", "logs", "checkpoints", "build", "*.egg-info", "__pycache__")(
                folder, names
            )
            | ({"data"} if Path(folder) == Path(ROOT) else set())
        ),  # the datasets folder, not the package vit/data
    )
    wheels = tmp / "dist"
    build = _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src)],
        cwd=tmp,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = wheels.glob("vit_toolkit-*.whl")
    env_dir = tmp / "venv"
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], cwd=tmp)
    assert made.returncode == 0, made.stderr
    py = env_dir / "bin" / "python"
    site = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp).stdout.strip()
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = _run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-index", str(wheel)], cwd=tmp
    )
    assert install.returncode == 0, install.stderr[-2000:]
    return env_dir


# In one process of the installed environment: where `import vit` comes from, and each installed console script's
# entry point, loaded as its wrapper loads it and run with --help (six processes importing torch cost 65 s of the
# suite on a 2-core CPU, a seventh for the package's path 3 s more); the wrappers themselves are checked as files.
INSTALLED = r"""
import contextlib, io, json, pathlib, sys
from importlib.metadata import entry_points

import vit

eps = {e.name: e for e in entry_points(group="console_scripts")}
answers = {}
for name in sys.argv[1:]:
    out = io.StringIO()
    sys.argv = [name, "--help"]
    try:
        with contextlib.redirect_stdout(out):
            code = eps[name].load()()
    except SystemExit as e:
        code = e.code
    answers[name] = [code or 0, "usage" in out.getvalue().lower()]
print(json.dumps({"package": str(pathlib.Path(vit.__file__).parent), "help": answers}))
"""


@pytest.fixture(scope="module")
def installed(venv) -> dict:
    import json

    run = _run([str(venv / "bin" / "python"), "-c", INSTALLED, *SCRIPTS], cwd=venv.parent)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.splitlines()[-1])


def test_the_wheel_carries_the_package_and_the_configs(venv, installed):
    pkg = Path(installed["package"])
    assert pkg.is_relative_to(venv), pkg  # the installed copy, not the repository's
    assert (pkg / "configs" / "smoke.yaml").is_file() and (pkg / "configs" / "variants" / "moe.yaml").is_file()
    assert (pkg / "static" / "index.html").is_file() and (pkg / "commands" / "serve.py").is_file()  # vit-serve's page


def test_each_console_script_answers_help(venv, installed):
    for script in SCRIPTS:
        wrapper = (venv / "bin" / script).read_text()
        assert wrapper.startswith(f"#!{venv}/bin/python") and "from vit.commands." in wrapper, (script, wrapper)
    assert installed["help"] == {script: [0, True] for script in SCRIPTS}


def test_vit_train_runs_a_smoke_fit_from_another_folder_exits_0_through_teardown_and_loses_nothing(venv, tmp_path):
    """The installed `vit-train` (`python train.py` is the same `run()`) with a packaged config, from a folder that
    is not the repository: it exits 0 through the interpreter's normal teardown, so a user's atexit handler (W&B,
    MLflow flush at exit) runs; the printed summary, every TensorBoard event and the checkpoints are there. (One
    process for both: a smoke fit in a fresh interpreter costs 10-17 s of the suite.)"""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from vit.model.checkpoint import load_model

    # sitecustomize runs in the child at start-up: it registers an atexit handler as a logger library would.
    (tmp_path / "site").mkdir()
    marker = tmp_path / "atexit-ran"
    (tmp_path / "site" / "sitecustomize.py").write_text(
        f"import atexit, pathlib\natexit.register(lambda: pathlib.Path({str(marker)!r}).write_text('ok'))\n"
    )
    args = [str(venv / "bin" / "vit-train"), "--config", "configs/smoke.yaml", "--trainer.enable_progress_bar", "false"]
    run = _run(args, cwd=tmp_path, pythonpath=tmp_path / "site")
    assert run.returncode == 0, run.stderr[-3000:]
    assert marker.read_text() == "ok"
    assert "best val/acc" in run.stdout and "last:" in run.stdout
    ea = EventAccumulator(str(tmp_path / "logs" / "smoke" / "version_0"), size_guidance={"images": 0, "scalars": 0})
    ea.Reload()
    assert len(ea.Scalars("val/acc")) == 2 and len(ea.Images("attention/mean_distance")) == 2
    assert "eval/confusion_matrix" in ea.Tags()["images"]
    load_model(tmp_path / "checkpoints" / "smoke" / "version_0" / "last.ckpt")


def _imports_inside_vit() -> dict[str, set[str]]:
    """module -> the vit modules it imports, at module level or inside functions (both run eventually)."""
    import ast

    pkg = ROOT / "vit"
    mods = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p for p in pkg.rglob("*.py")}
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            # `from vit import x` names module vit.x; `from vit.x import f` names vit.x
            edges[name] |= {t for t in targets if t in mods and t not in (name, "vit")}
    return edges


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> list[str] | None:
        state[m] = 1
        for n in sorted(edges[m]):
            if state.get(n) == 1:
                return path[path.index(n) :] + [m, n] if n in path else [m, n]
            if n not in state and (found := visit(n, path + [m])):
                return found
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (found := visit(m, [])):
            return found
    return None


def test_no_import_cycle_inside_vit():
    edges = _imports_inside_vit()
    assert len(edges) > 20 and "vit.commands.predict" in edges  # the walk found the package and its commands
    assert _cycle(edges) is None, " -> ".join(_cycle(edges))
    # the check itself finds a cycle when there is one
    assert (
        _cycle(
            {
                **edges,
                "vit.model.vision_transformer": edges["vit.model.vision_transformer"] | {"vit.deployment.predict"},
            }
        )
        is not None
    )


def test_commands_sit_above_the_functions_they_call():
    """Only vit/commands/ holds command lines: no module below imports a command or argparse."""
    edges = _imports_inside_vit()
    for name, targets in edges.items():
        if not name.startswith("vit.commands"):
            assert not {t for t in targets if t.startswith("vit.commands")}, name
    modules = [p for p in (ROOT / "vit").rglob("*.py") if "commands" not in p.relative_to(ROOT / "vit").parts]
    assert len(modules) > 50  # every subpackage, not only vit/*.py
    below = [p for p in modules if re.search(r"^\s*(import argparse|from argparse import)", p.read_text(), re.M)]
    assert below == [], below


def test_commands_define_no_reusable_classes():
    """vit/commands/ parses and calls: a class another command could use belongs to the package of its concern. The
    classes left are vit-train's LightningCLI subclass, which is the command itself, and the exception that ends a
    command line with exit status 2, which is the command layer's own."""
    import ast

    classes = {
        f"{path.name}:{node.name}"
        for path in sorted((ROOT / "vit" / "commands").glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
    }
    assert classes == {"train.py:ViTCLI", "command_line.py:UsageError"}


def test_the_training_command_parses_and_calls():
    """vit-train's LightningCLI hooks each hand one step to the library (vit/run/steps.py,
    vit/training/run.py): a hook long enough to hold a step of the run (a plan, resume, after-fit passes) fails here."""
    import ast

    tree = ast.parse((ROOT / "vit" / "commands" / "train.py").read_text())
    cli = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ViTCLI")
    hooks = {n.name: n.end_lineno - n.lineno + 1 for n in cli.body if isinstance(n, ast.FunctionDef)}
    assert {"before_instantiate_classes", "before_fit", "after_fit"} <= set(hooks)
    assert {name: n for name, n in hooks.items() if n > 12} == {}
    assert len((ROOT / "vit" / "commands" / "train.py").read_text().splitlines()) <= 180


def test_planning_computes_and_the_run_acts():
    """vit/planning/ holds the plan's pure functions: no Lightning Callback or Trainer (they live in vit/run/)."""
    import ast

    bases = {
        f"{path.name}:{node.name}"
        for path in (ROOT / "vit" / "planning").glob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and any("Callback" in ast.unparse(b) or "Trainer" in ast.unparse(b) for b in node.bases)
    }
    assert bases == set()


# The style guide's sizes: a module past ~450 lines holds two ideas, a function past ~80 lines does too. A file is
# split well before its cap (within 3% of it counts as at it), not squeezed under it.
MODULE_CAP, FUNCTION_CAP = 460, 80
MODULE_LINES, FUNCTION_LINES = int(MODULE_CAP * 0.97), int(FUNCTION_CAP * 0.97)


def _too_long(root: Path) -> list[str]:
    import ast

    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > MODULE_LINES:
            found.append(f"{path.relative_to(root)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > FUNCTION_LINES:
                    found.append(f"{path.relative_to(root)}: {node.name} {lines} lines")
    return found


def test_no_module_or_function_past_the_style_guides_size(tmp_path):
    assert _too_long(ROOT / "vit") == []
    # the check finds a long function and a long module
    (tmp_path / "long.py").write_text("def f():\n" + "    x = 1\n" * FUNCTION_LINES + "\n" * MODULE_LINES)
    assert _too_long(tmp_path) == [
        f"long.py: {MODULE_LINES + FUNCTION_LINES + 1} lines",
        f"long.py: f {FUNCTION_LINES + 1} lines",
    ]


def test_torch_is_required_at_a_version_whose_weights_only_load_holds():
    """torch.load(weights_only=True) can be bypassed in torch <= 2.5.1 (CVE-2025-32434): "checkpoints are data, not
    code" needs torch >= 2.6 on any install the package allows."""
    import re

    import tomllib

    deps = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_dep = next(d for d in deps if re.match(r"torch\b(?!vision)", d))
    low = tuple(int(v) for v in re.search(r">=\s*([\d.]+)", torch_dep).group(1).split(".")[:2])
    assert low >= (2, 6), torch_dep


def test_the_declared_lightning_floor_has_what_the_toolkit_uses():
    """pyproject.toml allowed lightning 2.4, where EMAWeightAveraging and LightningCLI's _parse_ckpt_path hook
    (vit/commands/train.py) do not exist: the floor must be the release that brought them, 2.6."""
    import re

    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    floor = next(re.search(r">=\s*([\d.]+)", d).group(1) for d in deps if d.startswith("lightning"))
    assert tuple(int(x) for x in floor.split(".")[:2]) >= (2, 6)
    from lightning.pytorch.callbacks import EMAWeightAveraging  # noqa: F401  what needs it


# The subpackages of vit/, lowest first; a package imports only from packages of a lower rank (model and data, and
# planning and deployment, import neither each other). vit/__init__.py names the same order.
RANKS = {"model": 0, "data": 0, "training": 1, "evaluation": 2, "planning": 3, "deployment": 3, "run": 4, "commands": 5}


def _upward(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    package = lambda module: module.split(".")[1] if module.count(".") >= 1 else ""  # noqa: E731
    return sorted(
        (src, dst)
        for src, targets in edges.items()
        for dst in targets
        if package(src) in RANKS and package(dst) != package(src) and not RANKS[package(dst)] < RANKS[package(src)]
    )


def test_packages_import_only_from_lower_ones():
    edges = _imports_inside_vit()
    assert {m.split(".")[1] for m in edges if m.count(".") >= 2} == set(RANKS)  # every subpackage is ranked
    assert not [m for m in edges if m.count(".") == 1 and m.split(".")[1] not in RANKS], "a module outside the packages"
    assert _upward(edges) == []
    # the check finds an upward import when there is one, and a sideways one between packages of one rank
    assert _upward({**edges, "vit.model.layers": {"vit.training.module"}}) == [
        ("vit.model.layers", "vit.training.module")
    ]
    assert _upward({"vit.data.images": {"vit.model.config"}}) == [("vit.data.images", "vit.model.config")]


def _module_level_imports(path: Path) -> set[str]:
    """What a module imports when it is imported: its top-level statements (and those under top-level if / try),
    not the imports inside its functions."""
    import ast

    found, todo = set(), list(ast.parse(path.read_text()).body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, (ast.If, ast.Try)):
            todo += [*node.body, *node.orelse, *getattr(node, "finalbody", []), *getattr(node, "handlers", [])]
        elif isinstance(node, ast.ExceptHandler):
            todo += node.body
    return found


def _started_with(command: str) -> set[str]:
    """Every module, of vit and outside it, that importing `command` imports at module level (vit's followed)."""
    pkg = ROOT / "vit"
    mods = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p for p in pkg.rglob("*.py")}
    seen, todo = set(), [command]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parents = [".".join(name.split(".")[:i]) for i in range(2, name.count(".") + 1)]  # packages' __init__ run too
        todo += [p for p in parents if p in mods]
        if name in mods:
            todo += sorted(_module_level_imports(mods[name]))
    return seen


def test_vit_predict_and_vit_serve_start_without_lightning_or_torchmetrics():
    """Importing torchmetrics imports scipy.signal: 1.1 s of the 4.8 s `vit-predict` took to start; Lightning imports
    torchmetrics. The commands that answer images (predict, serve, export, attention) import neither when they start;
    the functions that need them import them where they are called."""
    for command in ("vit.commands.predict", "vit.commands.serve", "vit.commands.export", "vit.commands.attention"):
        started = _started_with(command)
        assert "vit.deployment.predict" in started or command != "vit.commands.predict"  # the walk follows vit
        heavy = sorted(m for m in started if m.split(".")[0] in ("lightning", "torchmetrics", "scipy"))
        assert heavy == [], (command, heavy)
    assert any(m.startswith("torchmetrics") for m in _started_with("vit.commands.eval"))  # the check sees one
