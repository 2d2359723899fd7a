"""A small, faithful copy of the NeMo-RL modules colo-shim reads, for the colocated e2e harness.

Module paths, class and function names, and the call order around the generation engine follow
NeMo-RL main (7ea279a, 2026-08) / v0.7.0, as tests/doubles/nemo_rl_main does; unlike the doubles,
the bodies drive the real megatron-core model and the real vLLM engine in their own processes
(bench/e2e/rpc.py stands in for Ray). colo-shim decides the vLLM sleep level from these frames
(grpo_train, setup, validate) exactly as it would in NeMo-RL.
"""
