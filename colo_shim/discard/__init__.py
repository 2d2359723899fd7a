"""Fix 2, discarding vLLM weights a refit will overwrite (family `vllm`).

vllm.py declares what is wrapped; policy.py decides on the driver whether a refit follows;
guard.py, in the engine's process, applies the level and refuses to generate on discarded
weights; coverage.py learns what a refit rewrites and keeps the rest.
"""
