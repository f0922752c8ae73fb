"""camkit.strategies (SpRAy): hand-made map sets with known groups, the score by hand, seeds,
edge cases, the map file."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
import torch

from camkit.errors import ArgumentError, InputError, RunFileError
from camkit.runs.maps import write_maps
from camkit.strategies import (
    StrategyWarning,
    analyze_class,
    eigengap,
    find_strategies,
    load_maps,
    pool_maps,
    suspiciousness,
)

CENTRES = [(4, 4), (4, 27), (27, 4), (27, 27), (16, 16)]


def blobs(groups: list[int], side: int = 32, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Maps with a Gaussian blob at ``CENTRES[g]`` (jittered by a pixel, plus faint noise)
    for each group size in ``groups`` -> ``(maps (N, side, side), truth (N,))``."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:side, :side]
    maps, truth = [], []
    for group, count in enumerate(groups):
        for _ in range(count):
            cy, cx = np.array(CENTRES[group]) * side / 32 + rng.uniform(-1, 1, 2)
            blob = np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * (side / 16) ** 2))
            maps.append(blob + 0.02 * rng.random((side, side)))
            truth.append(group)
    order = rng.permutation(len(truth))
    return np.asarray(maps, np.float32)[order], np.asarray(truth)[order]


def same_partition(labels: np.ndarray, truth: np.ndarray) -> bool:
    pairs = {(int(a), int(b)) for a, b in zip(labels, truth, strict=True)}
    return len(pairs) == len(set(labels.tolist())) == len(set(truth.tolist()))


def test_pool_maps_by_hand():
    maps = np.zeros((2, 4, 4), np.float32)
    maps[0, :2, :2] = 1.0  # top-left quarter
    maps[1] = -1.0
    maps[1, 3, 3] = 4.0  # one positive pixel among negatives
    pooled = pool_maps(maps, 2)
    np.testing.assert_allclose(pooled[0], [[1.0, 0.0], [0.0, 0.0]])
    np.testing.assert_allclose(pooled[1], [[0.0, 0.0], [0.0, 1.0]])  # negatives clipped
    by_max = pool_maps(maps, 2, normalize="max", positive="abs")
    np.testing.assert_allclose(by_max[1], [[1.0, 1.0], [1.0, 1.75]] / np.float32(1.75))
    channels = pool_maps(torch.ones(1, 3, 4, 4), (1, 2))
    np.testing.assert_allclose(channels, [[[0.5, 0.5]]])
    assert not pool_maps(np.full((1, 4, 4), -1.0), 2).any()  # no positive mass: zeros


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_pool_maps_rejects_non_finite(bad):
    maps = np.ones((3, 4, 4))
    maps[2, 1, 1] = bad
    with pytest.raises(InputError, match=r"maps \[2\]"):
        pool_maps(maps)


@pytest.mark.parametrize(
    "maps, grid",
    [(np.ones((4, 4)), 2), (np.ones((0, 4, 4)), 2), (np.ones((2, 4, 4)), 0), ([1.0], 2)],
)
def test_pool_maps_rejects_bad_shapes(maps, grid):
    with pytest.raises((InputError, ArgumentError)):
        pool_maps(maps, grid)


def test_eigengap_by_hand():
    assert eigengap([0.0, 0.0, 0.0, 0.9, 1.0]) == 3
    assert eigengap([0.0, 0.5, 0.55, 0.6]) == 1
    assert eigengap([0.0, 0.1, 0.5, 0.9, 1.0], max_clusters=2, diffusion=1) == 2
    # plain gaps 0.1, 0.2, 0.6 -> 3; after 32 steps 1 - 0.9**32 = 0.966 is the largest -> 1
    assert eigengap([0.0, 0.1, 0.3, 0.9], diffusion=1) == 3
    assert eigengap([0.0, 0.1, 0.3, 0.9], diffusion=32) == 1
    assert eigengap([0.0]) == 1
    with pytest.raises(ArgumentError):
        eigengap([0.0, np.nan])


@pytest.mark.parametrize("groups", [[30, 20], [25, 20, 15], [20, 20, 20, 20]])
def test_blob_groups_found_by_eigengap(groups):
    maps, truth = blobs(groups)
    found = analyze_class(pool_maps(maps, 16), embedding=None)
    assert found.suggested_k == found.k == len(groups)
    assert same_partition(found.labels, truth)
    # clusters are numbered by size and hold exactly their group's samples
    assert [c.size for c in found.clusters] == sorted(groups, reverse=True)
    for cluster in found.clusters:
        assert len(set(truth[cluster.members].tolist())) == 1
    eigenvalues = found.eigenvalues
    assert np.all(np.diff(eigenvalues) >= -1e-9) and abs(eigenvalues[0]) < 1e-9
    assert np.all(eigenvalues[: len(groups)] < 1e-6)  # one zero per separate group


def test_asked_number_of_clusters_beyond_max_clusters():
    maps, truth = blobs([20, 20, 20, 20])
    found = analyze_class(pool_maps(maps, 16), n_clusters=4, max_clusters=2, embedding=None)
    assert found.suggested_k <= 2 and found.k == 4 and same_partition(found.labels, truth)
    with pytest.raises(ArgumentError, match="n_clusters"):
        analyze_class(pool_maps(maps, 16), n_clusters=80)


def test_one_group_suggests_one():
    maps, _ = blobs([40])
    found = analyze_class(pool_maps(maps, 16), embedding=None)
    assert found.suggested_k == 1 and found.k == 1 and found.clusters[0].size == 40


@pytest.mark.parametrize("method", ["agglomerative", "dbscan", "hdbscan"])
def test_other_clusterings_find_the_groups(method):
    maps, truth = blobs([25, 20, 15])
    found = analyze_class(pool_maps(maps, 16), clustering=method, embedding=None)
    assert found.k == 3 and same_partition(found.labels, truth)


def test_cluster_summaries():
    maps, truth = blobs([30, 10])
    confidences = np.where(truth == 0, 0.9, 0.6)
    predictions = np.where(truth == 0, 5, np.arange(len(truth)) % 2 + 5)
    found = analyze_class(
        pool_maps(maps, 16),
        class_id=5,
        confidences=confidences,
        predictions=predictions,
        truth=np.full(len(truth), 5),
        n_show=3,
        embedding="spectral",
        n_neighbors=5,
    )
    big, small = found.clusters
    assert big.confidence == pytest.approx(0.9) and small.confidence == pytest.approx(0.6)
    assert big.accuracy == 1.0
    assert small.accuracy == pytest.approx(np.mean(predictions[truth == 1] == 5))
    # the typical members are the closest to the prototype, the atypical the farthest
    points = pool_maps(maps, 16).reshape(len(maps), -1)
    distance = np.linalg.norm(points[small.members] - small.prototype.ravel(), axis=1)
    assert np.all(np.diff(distance) >= 0)
    assert small.typical.tolist() == small.members[:3].tolist()
    assert small.atypical.tolist() == small.members[::-1][:3].tolist()
    np.testing.assert_allclose(small.prototype, points[truth == 1].mean(0).reshape(16, 16))
    assert found.embedding.shape == (40, 2)
    json.dumps(found.to_dict())


def test_suspiciousness_by_hand():
    pooled = np.zeros((3, 2, 2))
    pooled[0, 0, 0] = 1.0  # cluster 0: all its mass in one of 4 cells
    pooled[1:] = 0.25  # cluster 1: uniform
    scores = suspiciousness(pooled, np.array([0, 1, 1]))
    # P = (1, 0, 0, 0), Q = uniform: TV = (0.75 + 3 * 0.25) / 2 = 0.75; concentration 1 - 1/4
    assert scores[0] == pytest.approx((0.75 * 0.75, 0.75, 0.75))
    # the uniform cluster: the same distance, concentration 1 - e^ln4 / 4 = 0
    assert scores[1] == pytest.approx((0.0, 0.75, 0.0))
    assert suspiciousness(pooled, np.zeros(3, int))[0][0] == 0.0  # one cluster: nothing to compare


def test_small_corner_cluster_is_most_suspicious():
    maps, truth = blobs([40, 12])  # group 1: a blob in the top-right corner
    maps[truth == 0] = np.float32(1.0)  # the object strategy spreads over the whole map
    maps[truth == 0] += np.random.default_rng(1).random((40, 32, 32), dtype=np.float32)
    found = analyze_class(pool_maps(maps, 16), embedding=None)
    first = found.by_suspiciousness()[0]
    assert set(truth[first.members].tolist()) == {1}
    assert first.suspiciousness > 5 * found.by_suspiciousness()[1].suspiciousness


def test_same_seed_same_result():
    maps, _ = blobs([20, 20, 20], seed=3)
    pooled = pool_maps(maps, 16)
    one = analyze_class(pooled, seed=7)
    two = analyze_class(pooled, seed=7)
    np.testing.assert_array_equal(one.labels, two.labels)
    np.testing.assert_array_equal(one.embedding, two.embedding)
    np.testing.assert_array_equal(one.eigenvalues, two.eigenvalues)


def test_sparse_solver_agrees_with_dense(monkeypatch):
    maps, truth = blobs([30, 25, 20])
    pooled = pool_maps(maps, 16)
    dense = analyze_class(pooled, embedding=None)
    monkeypatch.setattr("camkit.strategies.spectrum.DENSE_LIMIT", 10)
    sparse = analyze_class(pooled, embedding=None)
    np.testing.assert_allclose(sparse.eigenvalues, dense.eigenvalues, atol=1e-6)
    assert sparse.k == 3 and same_partition(sparse.labels, truth)


def test_too_few_samples_is_a_clear_error():
    maps, _ = blobs([6])
    with pytest.raises(ArgumentError, match=r"6 map\(s\).*at least 11"):
        analyze_class(pool_maps(maps, 8))
    with pytest.raises(ArgumentError, match="at least 3"):
        analyze_class(pool_maps(maps[:1], 8), n_neighbors=1)


def test_constant_maps_are_one_strategy():
    with pytest.warns(StrategyWarning, match="all 12 maps are the same"):
        found = analyze_class(pool_maps(np.full((12, 8, 8), 0.3), 4), embedding="tsne")
    assert found.k == 1 and found.clusters[0].size == 12 and found.suggested_k == 1
    assert found.clusters[0].suspiciousness == 0.0 and np.isfinite(found.embedding).all()


def test_a_small_tsne_runs_on_one_thread(monkeypatch):
    """Barnes-Hut t-SNE of a few maps on one OpenMP thread: its per-iteration barriers made
    64 maps take 13 s instead of 0.3 s on 2 busy cores."""
    from sklearn.manifold import TSNE
    from threadpoolctl import threadpool_info

    from camkit.strategies.clustering import embed_2d

    seen = []
    fit = TSNE.fit_transform

    def spy(self, data, *args, **kwargs):
        seen.append(
            [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "openmp"]
        )
        return fit(self, data, *args, **kwargs)

    monkeypatch.setattr(TSNE, "fit_transform", spy)
    maps, _ = blobs([12, 12])
    pooled = pool_maps(maps, 8)
    coordinates, keep = embed_2d(pooled, np.zeros((24, 2)), "tsne", seed=0, limit=100)
    assert coordinates.shape == (24, 2) and keep.tolist() == list(range(24))
    assert seen and seen[0] and all(threads == 1 for threads in seen[0])


def test_find_strategies_per_class_and_skips_small_classes():
    maps, truth = blobs([20, 15, 15, 4])
    classes = np.where(truth < 3, np.where(truth == 0, 7, 8), 9)  # class 8 = groups 1 and 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = find_strategies(maps, classes, grid=16, embedding=None, n_neighbors=5)
    assert sorted(result.classes) == [7, 8] and 9 in result.skipped
    assert "4 map(s)" in result.skipped[9]
    eight = result.classes[8]
    assert eight.k == 2 and sorted(eight.indices.tolist()) == np.flatnonzero(classes == 8).tolist()
    for cluster in eight.clusters:  # members index the input arrays
        assert len(set(truth[cluster.members].tolist())) == 1
    with pytest.raises(ArgumentError, match="one value per map"):
        find_strategies(maps, classes[:-1])


def test_map_file_round_trip(tmp_path):
    maps = np.random.default_rng(0).random((5, 6, 7)).astype(np.float32)
    index = {
        "image": [f"im{i}.png" for i in range(5)],
        "method": ["gradcam"] * 5,
        "target": range(5),
        "probability": np.linspace(0, 1, 5),
        "prediction": [1] * 5,
        "confidence": [0.5] * 5,
        "truth": [-1] * 5,
    }
    blocks = (maps[:2], maps[2:])
    write_maps(tmp_path / "maps.npz", blocks, 5, (6, 7), index, {"labels": ["a", "b"]})
    loaded = load_maps(tmp_path)
    assert isinstance(loaded.maps, np.memmap) and loaded.maps.dtype == np.float16
    np.testing.assert_array_equal(loaded.maps, maps.astype(np.float16))
    assert loaded.image.tolist() == index["image"] and loaded.labels() == ["a", "b"]
    plain = np.load(tmp_path / "maps.npz")  # numpy alone
    np.testing.assert_array_equal(plain["maps"], maps.astype(np.float16))
    assert json.loads(str(plain["metadata"])) == {"version": 1, "labels": ["a", "b"]}
    with pytest.raises(InputError, match="--save-maps"):
        load_maps(tmp_path / "nothing")
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(RunFileError, match=r"bad\.npz.*not a complete map file.*--save-maps"):
        load_maps(tmp_path / "bad.npz")


def test_concentration_is_bounded():
    pooled = np.random.default_rng(0).random((10, 4, 4))
    for score, distance, concentration in suspiciousness(pooled, np.arange(10) % 2).values():
        assert 0 <= distance <= 1 and 0 <= concentration <= 1 - 1 / 16 + 1e-12
        assert math.isclose(score, distance * concentration)
