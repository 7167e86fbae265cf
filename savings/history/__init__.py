"""GPUs allocated, used and idle per node pool over the last day, week or month, from
Prometheus: the control plane's own `gpu_capacity_pool_gpus` and DCGM's utilization."""
