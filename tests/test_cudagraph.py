"""evalkit.metrics._cudagraph: the switch and the eager path. Replays themselves need a CUDA device (not
in CI): their equality with eager launches is shown by ``benchmarks/bench_pipeline.py
--variants ours,ours:EVALKIT_CUDA_GRAPHS=0`` (the metric means must agree; raw results in
``benchmarks/results/``)."""

from __future__ import annotations

import torch

from evalkit.metrics._cudagraph import GraphCache, graphs_enabled


def test_switch_reads_the_environment_per_call(monkeypatch):
    monkeypatch.delenv("EVALKIT_CUDA_GRAPHS", raising=False)
    assert graphs_enabled()
    monkeypatch.setenv("EVALKIT_CUDA_GRAPHS", "0")
    assert not graphs_enabled()
    monkeypatch.setenv("EVALKIT_CUDA_GRAPHS", "1")
    assert graphs_enabled()


def test_cpu_tensors_run_eagerly_and_reach_the_sink():
    cache = GraphCache("test")
    got = []
    x = torch.arange(6.0)
    cache.run(lambda t: t * 2, (x,), "k", got.append)
    assert len(got) == 1 and torch.equal(got[0], x * 2)
    assert cache.captures == 0 and cache.replays == 0 and not cache.usable(x)
