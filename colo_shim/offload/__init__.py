"""Fix 3, the optimizer offload and reload at the bus's speed (family `offload`).

megatron.py declares what is wrapped and why; mirrors.py holds the page-locked host tensors the
copies go through, reused every step; advice.py is what doctor says about them.
"""
