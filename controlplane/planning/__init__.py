"""The planner: a pure Python package (no Django) shared by the API, the CLI, the dashboard and the
rebalancer. Entry points:

- ``plan(request) -> Plan``: the best plan for a fleet, a model and a workload;
- ``baseline_plan(request, kind)``: even or memory-proportional split, for comparison;
- ``validate(edited, request) -> ValidationReport``: what-if check of an operator-edited plan;
- ``check(edited, request)``: its problems and the plan priced, without the planner's own plan to
  compare with (what deploying needs; the planner's search is most of a what-if's time);
- ``least_change_plan(applied, request, keep_within)``: a re-plan that moves only what it must unless
  a fresh plan serves enough better to pay for the stages it restarts (after a loss or for a drain);
- ``plan_to_dict`` / ``plan_from_dict``: the JSON form (schema in docs/planner.md); ``stored_plan`` and
  ``replica_placements`` read a stored one, full or only placed (an operator's edit).
"""

from controlplane.planning.baselines import baseline_plan
from controlplane.planning.plan import (
    Bottleneck,
    Figures,
    MemoryBreakdown,
    Placement,
    Plan,
    ReplicaPlan,
    StagePlan,
)
from controlplane.planning.planner import plan
from controlplane.planning.repair import least_change_plan
from controlplane.planning.request import Pin, PlanningError, PlanRequest, Workload
from controlplane.planning.serialize import (
    placements_from_dict,
    plan_from_dict,
    plan_to_dict,
    replica_placements,
    stored_plan,
)
from controlplane.planning.validate import Problem, ValidationReport, check, validate

__all__ = [
    "Bottleneck", "Figures", "MemoryBreakdown", "Pin", "Placement", "Plan", "PlanRequest", "PlanningError",
    "Problem", "ReplicaPlan", "StagePlan", "ValidationReport", "Workload", "baseline_plan", "check",
    "least_change_plan", "placements_from_dict", "plan", "plan_from_dict", "plan_to_dict",
    "replica_placements", "stored_plan", "validate",
]
