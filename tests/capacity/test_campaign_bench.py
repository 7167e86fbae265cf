"""The campaign bench's measure (bench/campaign.py) on a small cluster of the fleet bench's
generator: a campaign never moves a pod twice nor lands one on a node it frees, and never
claims more than the lower bound allows."""
from __future__ import annotations

import importlib.util
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from clusters.snapshot import ClusterSnapshot, NodeView, PodView

BENCH = Path(__file__).resolve().parents[2] / "bench" / "campaign.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("campaign_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_the_campaign_moves_each_pod_once_and_frees_at_most_the_lower_bound(bench):
    docs = bench.scaled_down(bench.fleet_docs(200, 1500, seed=1), 0.5)
    snapshot = ClusterSnapshot.build(taken_at=datetime(2026, 1, 1, tzinfo=UTC),
                                     nodes=[NodeView.from_object(d) for d in docs if d["kind"] == "Node"],
                                     pods=[PodView.from_object(d) for d in docs if d["kind"] == "Pod"])
    results = bench.measure(snapshot)
    assert {(r.pool, r.scoring) for r in results} == {(pool, scoring) for pool in
                                                      ("p5.48xlarge", "p4de.24xlarge", "g5.8xlarge")
                                                      for scoring in ("LeastAllocated", "MostAllocated")}
    for r in results:
        assert r.campaign.moved_twice == 0 and r.campaign.onto_freed == 0, r
        assert r.campaign.freed <= r.most_freeable, r
        assert r.one_at_a_time.freed <= r.most_freeable, r
    # The generator leaves the 8-GPU pools fragmented: the campaign frees nodes there.
    assert all(r.campaign.freed > 0 for r in results if r.pool != "g5.8xlarge")


def test_an_executed_campaign_moves_each_pod_once_and_lands_none_on_its_nodes(bench, db):
    """The executed measure on a tiny generated pool (four half-empty nodes): the campaign,
    stepped on the simulated cluster, frees nodes with every pod moved once and no
    replacement on a node it frees."""
    from _campaign_run import run_campaign

    docs = bench.generated_pool(4)
    executed = run_campaign(docs, selector=bench.GENERATED_POOL, scoring="LeastAllocated", max_in_flight=2)
    assert executed.freed >= 1
    assert (executed.moved_twice, executed.onto_freed) == (0, 0)
    assert executed.pods_moved >= executed.freed          # a freed node had at least one pod
    assert executed.seconds_to_all_safe is not None and executed.seconds_to_all_safe > 0
