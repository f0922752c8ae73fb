"""The explorer inside a notebook: ``examples/explore.ipynb`` executed headless (nbclient with
an ipykernel) shows the page inline and answers; ``camkit.explore`` on a module with pictures
in memory; the rich displays of the strategies."""

from __future__ import annotations

import json
import os
import socket
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import camkit

pytest.importorskip("starlette", reason="camkit serve's web stack: pip install 'camkit[serve]'")
ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "explore.ipynb"


@pytest.mark.slow
def test_the_example_notebook_runs_headless_and_shows_the_explorer(
    tmp_path: Path, monkeypatch
) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    inherited = os.environ.get("PYTHONPATH", "")  # the kernel imports this checkout's camkit
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT / "src"), inherited])))
    client = nbclient.NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    )
    client.execute()
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    shown = code[1].outputs[0]["data"]
    assert shown["text/html"].startswith('<iframe src="http://127.0.0.1:')
    assert "?token=" in shown["text/html"] and "Exploration(running" in shown["text/plain"]
    printed = "".join(output.get("text", "") for output in code[2].outputs)
    assert "efficientnet_lite0: 5 images" in printed
    assert "image 0, top-1:" in printed and "cat" in printed  # chelsea is a tabby cat
    stopped = code[3].outputs[0]["data"]
    assert stopped["text/html"] == "<p>camkit explorer: stopped</p>"
    port = int(shown["text/html"].split("127.0.0.1:")[1].split("/")[0])
    with socket.socket() as probe:  # the server is gone: the port no longer answers
        assert probe.connect_ex(("127.0.0.1", port)) != 0


def test_explore_a_module_on_pictures_in_memory() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(4, 3),
    ).eval()  # fmt: skip
    before = [p.detach().clone() for p in model.parameters()]
    pictures = [np.full((20, 30, 3), 40 * k, np.uint8) for k in range(1, 4)]
    with (
        pytest.warns(camkit.models.AssumedPreprocessWarning, match="ImageNet's mean"),
        camkit.explore(model, pictures, labels=["a", "b", "c"], input_size=32) as view,
    ):
        base, token = view.url.split("?token=")
        with urllib.request.urlopen(f"{base}api/info?token={token}") as reply:
            info = json.load(reply)
        assert info["labels"] == ["a", "b", "c"] and info["images"] == 3
        assert info["default_layer"] == "1"
        with urllib.request.urlopen(f"{base}api/map?image=2&class=1&format=npy&token={token}"):
            pass
        refused = urllib.request.Request(f"{base}api/info")
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(refused)
        assert answer.value.code == 401
        with urllib.request.urlopen(f"{base}") as page:
            policy = page.headers["content-security-policy"]
        assert "frame-ancestors http://localhost:*" in policy and "vscode-webview:" in policy
    assert not view.running and "stopped" in view._repr_html_()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    assert model.training is False and all(p.grad is None for p in model.parameters())
    with pytest.raises(camkit.CamkitError, match="2 class names but the model has 3 classes"):
        camkit.explore(model, pictures, labels=["a", "b"], input_size=32)
    with pytest.raises(camkit.CamkitError, match="expected a torch.nn.Module"):
        camkit.explore(42, pictures)


def test_strategies_show_as_a_table_and_a_prototype_picture() -> None:
    from camkit.strategies import find_strategies

    rng = np.random.default_rng(0)
    left = np.zeros((16, 16), np.float32)
    left[:, :8] = 1
    maps = np.stack(
        [np.roll(left, 8 * (k % 2), axis=1) + rng.random((16, 16)) * 0.05 for k in range(24)]
    )
    found = find_strategies(maps, np.zeros(24, int), grid=8)
    page = found._repr_html_()
    assert page.startswith("<table>") and page.count("data:image/png;base64,") >= 2
    cluster = found.classes[0].clusters[0]
    png = cluster._repr_png_()
    assert png.startswith(b"\x89PNG")
    assert found.classes[0]._repr_html_().count("<tr>") == 1 + found.classes[0].k
