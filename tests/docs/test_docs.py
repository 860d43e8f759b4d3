"""The docs never rot: every `$ onnxgrad ...` line in a ```console block is run, and its exit code
and the output the doc shows are checked; every relative link and #anchor resolves.

Conventions for doc writers (also in docs/cli.md):
- A console block holds `$ command` lines, each followed by the output it prints (stdout and
  stderr together). Output lines are matched in order against the real output, a subset is fine;
  numbers match to 1e-3 relative, and `...` inside a line matches any run of words.
- A command expected to fail ends with a shell comment `# exit N`.
- Commands run from a scratch folder that mirrors the repository root, one folder per doc file,
  in order: a file written by one command can be read by the next.
- `onnxgrad` commands run in-process, through the console script's function; commands that
  would open the explorer go in ```bash blocks instead (only a failing `explore` may be shown);
  `python` and `torchrun` commands in a subprocess (torchrun as `python -m torch.distributed.run`);
  anything else (pip, pytest, git) is shown to the reader but not run here.
- Every ```python block is executed (fresh namespace, same scratch folder); put `assert`s in it
  for what the text claims. A ```python block whose first line is `# file: NAME.py` is a script
  instead: it is written to the scratch folder before the doc's console commands run, for them to
  launch, and not executed on its own.
"""
from __future__ import annotations

import math
import os
import pathlib
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass

import pytest

from tests import paths

ROOT = paths.ROOT
DOC_FILES = sorted([ROOT / "README.md", ROOT / "sample_models" / "README.md", *(ROOT / "docs").glob("*.md")])
DOC_FILES = [p for p in DOC_FILES if p.exists()]
INTERACTIVE = {"explore"}
EXIT_COMMENT = re.compile(r"#\s*exit\s+(\d+)\s*$")


@dataclass(frozen=True)
class DocCommand:
    line: int
    text: str
    expected: tuple[str, ...]
    exit_code: int


def console_commands(text: str) -> list[DocCommand]:
    commands: list[DocCommand] = []
    in_block, current, expected = False, None, []

    def flush():
        if current is not None:
            commands.append(DocCommand(current[0], current[1], tuple(expected), current[2]))

    lines = text.splitlines()
    i = 0
    while i < len(lines):
        raw = lines[i]
        stripped = raw.strip()
        if not in_block:
            in_block = stripped.startswith("```console")
        elif stripped.startswith("```"):
            flush()
            in_block, current, expected = False, None, []
        elif stripped.startswith("$ "):
            flush()
            start, command = i + 1, stripped[2:]
            while command.endswith("\\") and i + 1 < len(lines):
                i += 1
                command = command[:-1] + " " + lines[i].strip()
            m = EXIT_COMMENT.search(command)
            current, expected = (start, command, int(m.group(1)) if m else 0), []
        elif current is not None and stripped:
            expected.append(stripped)
        i += 1
    return commands


# --- approximate line matching --------------------------------------------------------------------
NUMBER = re.compile(r"^([^\d+\-.]*)([+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)([^\d]*)$", re.I)


def _token_matches(want: str, got: str) -> bool:
    if want == got:
        return True
    a, b = NUMBER.match(want), NUMBER.match(got)
    if not (a and b) or a.group(1) != b.group(1) or a.group(3) != b.group(3):
        return False
    x, y = float(a.group(2)), float(b.group(2))
    return math.isclose(x, y, rel_tol=1e-3, abs_tol=1e-5)


def line_matches(want: str, got: str) -> bool:
    wants, gots = want.split(), got.split()

    def match(i: int, j: int) -> bool:
        if i == len(wants):
            return j == len(gots)
        if wants[i] in ("...", "…"):
            return any(match(i + 1, k) for k in range(j, len(gots) + 1))
        return j < len(gots) and _token_matches(wants[i], gots[j]) and match(i + 1, j + 1)

    return match(0, 0)


def missing_lines(expected, actual) -> list[str]:
    """Expected lines not found, in order, among the actual ones."""
    missing, pos = [], 0
    for want in expected:
        for k in range(pos, len(actual)):
            if line_matches(want, actual[k]):
                pos = k + 1
                break
        else:
            missing.append(want)
    return missing


# --- running --------------------------------------------------------------------------------------
def _mirror_repository(folder: pathlib.Path) -> None:
    for entry in ROOT.iterdir():
        if entry.name != ".git":
            (folder / entry.name).symlink_to(entry)


def console_script():
    """The function the `onnxgrad` console script calls, as pyproject.toml declares it."""
    import importlib

    import tomllib

    target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["onnxgrad"]
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)


def _opens_the_app(argv: list[str], exit_code: int) -> bool:
    opens = len(argv) == 1 or argv[1] in INTERACTIVE or argv[1].endswith(".onnx")  # `onnxgrad MODEL.onnx`
    return opens and exit_code == 0 and "--help" not in argv


def _run(command: DocCommand, capsys) -> tuple[int, str] | None:
    argv = shlex.split(command.text, comments=True)
    if argv[0] == "onnxgrad":
        assert not _opens_the_app(argv, command.exit_code), \
            f"line {command.line}: a command that opens the explorer goes in a ```bash block"
        capsys.readouterr()
        try:
            code = console_script()(argv[1:])
        except SystemExit as exc:  # --help and argparse errors
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        out = capsys.readouterr()
        return code, out.out + out.err
    launchers = {"python": [sys.executable], "torchrun": [sys.executable, "-m", "torch.distributed.run"]}
    if argv[0] in launchers:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        proc = subprocess.run(launchers[argv[0]] + argv[1:], capture_output=True, text=True, env=env, timeout=300)
        return proc.returncode, proc.stdout + proc.stderr
    return None


SCRIPT = re.compile(r"\A# file: (\S+\.py)\n")


def write_scripts(text: str, folder: pathlib.Path) -> None:
    """The doc's `# file: NAME.py` python blocks, as files its console commands can run."""
    for _, code in python_blocks(text):
        m = SCRIPT.match(code)
        if m:
            (folder / m.group(1)).write_text(code)


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_console_blocks_run(doc, tmp_path, monkeypatch, capsys):
    commands = console_commands(doc.read_text())
    _mirror_repository(tmp_path)
    write_scripts(doc.read_text(), tmp_path)
    monkeypatch.chdir(tmp_path)
    problems = []
    for command in commands:
        result = _run(command, capsys)
        if result is None:
            continue
        code, output = result
        if code != command.exit_code:
            problems.append(f"line {command.line}: `{command.text}` exited {code}, the doc says "
                            f"{command.exit_code}\n{output}")
            continue
        missing = missing_lines(command.expected, output.splitlines())
        if missing:
            problems.append(f"line {command.line}: `{command.text}` did not print:\n  " + "\n  ".join(missing)
                            + "\nit printed:\n" + output)
    assert not problems, f"{doc.relative_to(ROOT)}:\n" + "\n\n".join(problems)


def test_docs_have_commands_to_run():
    ran = [c for d in DOC_FILES for c in console_commands(d.read_text()) if c.text.startswith("onnxgrad ")]
    assert len(ran) >= 10


def python_blocks(text: str) -> list[tuple[int, str]]:
    return [(text[:m.start()].count("\n") + 2, m.group(1))
            for m in re.finditer(r"^```python\n(.*?)^```", text, flags=re.S | re.M)]


@pytest.mark.parametrize("doc", [d for d in DOC_FILES if python_blocks(d.read_text())],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run(doc, tmp_path, monkeypatch, capsys):
    _mirror_repository(tmp_path)
    monkeypatch.chdir(tmp_path)
    for line, code in python_blocks(doc.read_text()):
        if SCRIPT.match(code):
            continue
        try:
            exec(compile(code, f"{doc.name}:{line}", "exec"), {"__name__": "__doc_example__"})
        except Exception as exc:
            pytest.fail(f"{doc.relative_to(ROOT)} line {line}: {type(exc).__name__}: {exc}")


# --- every command and flag is documented ------------------------------------------------------
def _subcommands() -> dict:
    import argparse

    from engine.cli import build_parser

    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_cli_md_documents_every_command_and_flag():
    text = (ROOT / "docs" / "cli.md").read_text()
    sections = dict(re.findall(r"^## onnxgrad (\w+)\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M))
    undocumented = []
    for name, parser in _subcommands().items():
        if name not in sections:
            undocumented.append(f"command {name}")
            continue
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help") and f"`{flag}" not in sections[name]:
                    undocumented.append(f"{name} {flag}")
    assert not undocumented, f"docs/cli.md lacks: {undocumented}"


def test_explorer_md_documents_every_key():
    import importlib
    import inspect
    import pkgutil

    from textual.binding import Binding

    text = (ROOT / "docs" / "explorer.md").read_text()
    modules = ["explorer.app"]
    for package in ("explorer.screens", "explorer.widgets"):
        modules += [f"{package}.{m.name}" for m in pkgutil.iter_modules(importlib.import_module(package).__path__)]
    ids = set()
    for name in modules:
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == name:
                ids |= {b.id for b in cls.__dict__.get("BINDINGS", []) if isinstance(b, Binding) and b.id}
    assert ids, "no explorer bindings found"
    missing = sorted(i for i in ids if f"`{i}`" not in text)
    assert not missing, f"docs/explorer.md lacks the bindings {missing}"


def test_benchmarks_md_covers_every_benchmark():
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    scripts = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py") if not p.name.startswith("_"))
    missing = [name for name in scripts if f"benchmarks/{name}" not in text]
    assert not missing, f"docs/benchmarks.md does not say how to run {missing}"


SNAPSHOTS = ROOT / "tests" / "explorer" / "__snapshots__" / "test_explorer_snapshots"


def _screen_text(svg: pathlib.Path) -> str:
    import html

    texts = re.findall(r"<text[^>]*>(.*?)</text>", svg.read_text())
    return re.sub(r"\s+", " ", html.unescape("".join(texts)).replace("\xa0", " "))


@pytest.mark.parametrize("snapshot, shown", [
    ("test_main_screen.svg", ["y Y", "xs W, Z", "zs X", "✓ valid: 3 nodes from xs to y"]),
    ("test_step_mode.svg", ["REVERSE 1/3", "dA = dY · Bᵀ", "dB = Aᵀ · dY", "[1, 1, 1]", "0.5422, 0.5422, 0.5422"]),
    ("test_backward_view.svg", ["∂Gemm", "∂Flatten", "∂Conv", "dY/dW", "dY/dZ"]),
])
def test_tutorial_describes_the_snapshots_it_shows(snapshot, shown):
    """docs/tutorial.md describes what these screens show; if a snapshot changes, revisit the text."""
    path = SNAPSHOTS / snapshot
    if not path.exists():
        pytest.skip(f"{snapshot} not generated")
    text = _screen_text(path)
    assert [s for s in shown if s not in text] == []


# --- quoted messages that no console block can show -----------------------------------------------
def _gradient_node_errors() -> list[str]:
    """The load errors semantics.md quotes for malformed Gradient nodes, produced for real."""
    from onnx import helper

    import engine
    from engine.examples import spec_conv_gemm

    def drop_input(node):
        node.input.pop()

    def extra_output(node):
        node.output.append("extra")

    def determined_x(node):
        node.ClearField("attribute")
        node.attribute.extend([helper.make_attribute("xs", ["H", "W"]), helper.make_attribute("zs", ["X"]),
                               helper.make_attribute("y", "Y")])

    messages = []
    for mutate in (determined_x, drop_input, extra_output):
        model = spec_conv_gemm()
        mutate(next(n for n in model.graph.node if n.op_type == "Gradient"))
        with pytest.raises(engine.OnnxGradError) as failure:
            engine.load(model)
        messages.append(str(failure.value))
    return messages


def test_semantics_quotes_real_gradient_node_errors():
    text = (ROOT / "docs" / "semantics.md").read_text()
    missing = [m for m in _gradient_node_errors() if m not in text]
    assert not missing, f"docs/semantics.md quotes stale messages; the engine now says: {missing}"


# --- links ----------------------------------------------------------------------------------------
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def github_anchor(heading: str) -> str:
    text = re.sub(r"[`*_]|<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    found, in_code = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            found.add(github_anchor(line.lstrip("#")))
    return found


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    broken = []
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):
            continue
        path_part, _, anchor = target.partition("#")
        path = (doc.parent / path_part).resolve() if path_part else doc
        if not path.exists():
            broken.append(target)
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)}: broken links {broken}"


# --- the harness itself ---------------------------------------------------------------------------
def test_harness_parses_and_matches():
    text = "```console\n$ onnxgrad ops \\\n  --json  # exit 2\nsome out\n\n$ pip install x\n```\n"
    cmds = console_commands(text)
    assert [(c.text, c.exit_code, c.expected) for c in cmds] == [
        ("onnxgrad ops  --json  # exit 2", 2, ("some out",)), ("pip install x", 0, ())]
    assert line_matches("y Y: norm 4.36666 min -3.441", "y Y: norm 4.366661 min -3.44102")
    assert not line_matches("norm 4.36", "norm 4.46")
    assert line_matches("dY/dW: shape (2, 1) ... max 2.3", "dY/dW: shape (2, 1) float32 norm 5 max 2.3")
    assert not line_matches("verdict: pass", "verdict: fail")
    assert missing_lines(["a", "c"], ["a", "b", "c"]) == [] and missing_lines(["c", "a"], ["a", "c"]) == ["a"]


def test_harness_writes_script_blocks_for_console_commands(tmp_path):
    text = "```python\n# file: hello.py\nprint('hi')\n```\n```python\nx = 1  # file: no.py\n```\n"
    write_scripts(text, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hello.py"]
    assert (tmp_path / "hello.py").read_text() == "# file: hello.py\nprint('hi')\n"
