"""The embedded default's file cache (controlplane.common.cache.FileCache): a batch lists the
directory once, and every value written reads back whole."""

from __future__ import annotations

import os

import pytest

from controlplane.common.cache import FileCache


def test_a_batch_culls_once_and_every_value_reads_back(tmp_path, monkeypatch):
    cache = FileCache(str(tmp_path), {"OPTIONS": {"MAX_ENTRIES": 1000}})
    culls = []
    monkeypatch.setattr(cache, "_cull", lambda: culls.append(1))
    samples = {f"telemetry:node:n{i}": {"node": f"n{i}", "devices": [{"index": 0, "power_w": i}]}
               for i in range(50)}
    cache.set_many(samples, 30)
    cache.set_many({"telemetry:node:n7": {"node": "n7", "devices": []}}, 30)  # replaced whole
    assert len(culls) == 2
    assert cache.get("telemetry:node:n49") == samples["telemetry:node:n49"]
    assert cache.get("telemetry:node:n7") == {"node": "n7", "devices": []}
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(cache._key_to_file(k)) for k in samples)


def test_a_value_that_cannot_be_written_leaves_no_file_behind(tmp_path):
    cache = FileCache(str(tmp_path), {})
    cache.set_many({"kept": 1}, 30)
    with pytest.raises((AttributeError, TypeError)):  # what pickle raises depends on the object
        cache.set_many({"lambda": lambda: None}, 30)
    assert cache.get("kept") == 1 and cache.get("lambda") is None
    assert os.listdir(tmp_path) == [os.path.basename(cache._key_to_file("kept"))]
