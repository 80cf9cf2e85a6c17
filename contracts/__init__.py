"""The shapes that cross motley's process boundaries, defined once (docs/contracts.md).

Hardware specs and the GPU catalog, the fleet file, a model's config and cost profile, precision
rules, the stage spec, what an agent reports (stage status, GPU metrics), Celery task names, the
key formats, the one formula for a stage's memory footprint, and what the gateway and the stages
share on the pipeline (the frames' envelope, the pipeline's errors, the sampling parameters). The
control plane, the planner, the agents and the workers all import these; none keeps its own copy.
Pure Python: this package imports neither Django nor torch nor anything else of motley
(import-linter checks it in CI).
"""
