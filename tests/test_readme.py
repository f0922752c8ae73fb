"""The README's snippets run as written (the quickstart and the metrics snippet, with the shapes
their comments state); its benchmark table is the one benchmarks/run.py wrote into
benchmarks/RESULTS.md."""

import ast
import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SHAPE_COMMENT = re.compile(r"#\s*\((\d+(?:,\s*\d+)*),?\)(\s+in \[0, 1\])?")


def snippet(section: str) -> str:
    """The first Python block under the heading ``section``."""
    code = README.read_text().split(f"## {section}", 1)[1].split("```python", 1)[1]
    return code.split("```", 1)[0]


def quickstart() -> str:
    return snippet("Quickstart")


def run_checking_shapes(code: str) -> int:
    """Run ``code`` statement by statement; check the ``# (shape)`` comment of each assignment;
    return how many were checked."""
    lines = code.splitlines()
    namespace: dict = {}
    checked = 0
    for statement in ast.parse(code).body:
        exec(compile(ast.Module([statement], []), str(README), "exec"), namespace)
        comment = SHAPE_COMMENT.search(lines[statement.end_lineno - 1])
        if comment is None:
            continue
        assert isinstance(statement, ast.Assign), ast.unparse(statement)
        value = namespace[statement.targets[0].id]
        shape = tuple(int(side) for side in comment.group(1).split(","))
        assert tuple(value.shape) == shape, ast.unparse(statement)
        if comment.group(2):
            assert isinstance(value, torch.Tensor) and 0 <= value.min() <= value.max() <= 1
        checked += 1
    return checked


def test_every_shape_comment_of_the_quickstart_is_checked():
    stated = [line for line in quickstart().splitlines() if SHAPE_COMMENT.search(line)]
    assert len(stated) >= 6  # the test below would check nothing if the comments changed form


@pytest.mark.slow
def test_quickstart_runs_and_gives_the_stated_shapes():
    assert run_checking_shapes(quickstart()) >= 6


def test_readme_benchmark_table_is_the_one_in_results():
    marks = ("<!-- benchmark table", "<!-- end of benchmark table -->")

    def block(text: str) -> str:
        start = text.index(marks[0])
        return text[start : text.index(marks[1], start)]

    assert block(README.read_text()) == block((ROOT / "benchmarks" / "RESULTS.md").read_text())


@pytest.mark.slow
def test_the_metrics_snippet_runs_as_written():
    """Every name it uses is defined in it (model, x, classes, masks, boxes), and the shapes of
    its comments hold (``(B,)`` comments name no number, so the maps' shape is the one checked)."""
    code = snippet("Is the map right?")
    assert "metrics.deletion(model, x, maps, classes)" in code
    assert run_checking_shapes(code) >= 2
