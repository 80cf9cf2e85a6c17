"""How an agent learns what devices its node has: NVML on real GPUs, a fleet file when emulating."""
