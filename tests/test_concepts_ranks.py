"""``torchrun -m camkit concepts``: two ranks share the images and rank 0 merges their parts
into the result of one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from test_concepts_cli import photos  # noqa: F401  (the fixture)

from camkit import cli
from camkit.cli.common import EXIT_UNREADABLE_IMAGES


@pytest.mark.slow
def test_two_torchrun_ranks_equal_one_process(photos, tmp_path):  # noqa: F811
    args = ["concepts", str(photos), "--layer", "blocks.2", "--top", "2", "--channels", "0-2"]
    args += ["--workers", "0", "--images-per-batch", "1", "--quiet"]
    assert cli.main([*args, "--out", str(tmp_path / "one")]) == EXIT_UNREADABLE_IMAGES
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    done = subprocess.run(
        [*torchrun, "-m", "camkit", *args, "--out", str(tmp_path / "two")],
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ | {"OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == EXIT_UNREADABLE_IMAGES, done.stderr
    one = json.loads((tmp_path / "one" / "concepts.json").read_text())
    two = json.loads((tmp_path / "two" / "concepts.json").read_text())
    assert one["images"] == two["images"] == 3
    assert not list((tmp_path / "two").glob("concepts.part-*.pt"))  # a finished run cleans up
    for channel, entries in one["channels"].items():
        for mode, rows in entries.items():
            again = two["channels"][channel][mode]
            assert [r["image"] for r in rows] == [r["image"] for r in again]
            assert [r["score"] for r in rows] == pytest.approx(
                [r["score"] for r in again], rel=1e-4
            )
