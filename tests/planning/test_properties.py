"""Invariants of every plan, on random fleets, models and workloads."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.planning import PlanningError, PlanRequest, Workload, plan, plan_to_dict
from tests.planning.factories import CARDS, fleet, profile

layouts = st.dictionaries(st.sampled_from(["n0", "n1", "n2"]),
                          st.lists(st.sampled_from(sorted(CARDS)), min_size=1, max_size=4),
                          min_size=1, max_size=3)


@settings(max_examples=40, deadline=None)
@given(layout=layouts, layers=st.integers(2, 24), layer_mparams=st.integers(50, 2000),
       batch=st.integers(1, 32), context=st.sampled_from([512, 2048, 8192]),
       share=st.sampled_from([0.0, 0.5, 1.0]),
       replicas=st.sampled_from(["auto", 1, 2]), objective=st.sampled_from(["throughput", "latency"]))
def test_every_plan_is_well_formed_and_deterministic(layout, layers, layer_mparams, batch, context, share,
                                                      replicas, objective):
    request = PlanRequest(fleet(layout), profile(num_layers=layers, layer_params=layer_mparams * 1_000_000),
                          Workload(batch=batch, context=context), objective=objective, max_quantized=share,
                          replicas=replicas)
    try:
        result = plan(request)
    except PlanningError as exc:
        assert "infeasible" in str(exc)
        return
    used = [s.device for r in result.replicas for s in r.stages]
    assert len(used) == len(set(used)), "a device carries two stages"
    if replicas != "auto":
        assert len(result.replicas) == replicas
    for replica in result.replicas:
        covered = [i for s in replica.stages for i in range(s.start, s.end)]
        assert covered == list(range(layers)), "every layer exactly once, stages contiguous and in order"
        for s in replica.stages:
            assert s.start < s.end
            assert s.memory.total_bytes <= s.memory.capacity_bytes
            assert s.kv_tokens >= batch * context
            assert s.bits in request.bits
        assert sum(s.end - s.start for s in replica.stages if s.bits < 16) <= request.quantized_layer_budget
        assert replica.predicted.decode_tokens_per_s > 0
    assert plan_to_dict(plan(request)) == plan_to_dict(result)
