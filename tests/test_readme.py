"""The README's quickstart runs as written."""

from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.slow
def test_quickstart_runs():
    code = README.read_text().split("## Quickstart", 1)[1].split("```python", 1)[1]
    exec(compile(code.split("```", 1)[0], str(README), "exec"), {})
