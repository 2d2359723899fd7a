"""Fix 3, the optimizer offload and reload at the bus's speed (family `offload`).

megatron.py declares what is wrapped and why; mirrors.py holds the page-locked host tensors the
copies go through, reused every step (pages.py: their memory); ahead.py makes them in background
threads before the offload that needs them; budget.py bounds them and is what doctor says about them.
"""
