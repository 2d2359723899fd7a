"""Stand-in package for bench/offload (see workers/megatron_policy_worker.py)."""
