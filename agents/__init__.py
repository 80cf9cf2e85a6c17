"""The node agent: registers a node, discovers its GPUs, runs stage processes for the control plane."""
