"""Exact layer partition and precision choice for one replica's devices: the two searches, one per
pipeline regime (see docs/planner.md, "Pipeline model"), by the one name the planner calls them.

* ``bottleneck_partition`` (``bottleneck.py``) minimises the slowest stage, for several
  micro-batches in flight: a parametric search over the bottleneck tau with a DP per tau, over the
  given order or (Held-Karp) every order of every subset of the devices.
* ``sum_partition`` (``chain.py``) minimises the sum of stage times and hops, for one micro-batch
  (the pipeline is a chain): a DP over (last device used, layer boundary, low-bit layers so far);
  ``sum_partition_kl`` (``chain_kl.py``) the same under the measured budget, over Pareto fronts of
  (KL spent, time) per (last device, boundary).

Both read their prices from ``price_tables.py`` (step times per device and precision, split stages,
hops) and return a ``Partition``.
"""

from controlplane.planning.bottleneck import bottleneck_partition
from controlplane.planning.chain import sum_partition
from controlplane.planning.chain_kl import sum_partition_kl
from controlplane.planning.price_tables import Partition

__all__ = ["Partition", "bottleneck_partition", "sum_partition", "sum_partition_kl"]
