"""Fix 1, the checkpoint fence (families `nvrx` and `megatron`).

nvrx.py and megatron.py declare what is wrapped; fence.py waits for pending saves; release.py
makes a finalized writer let go of CUDA storage; state.py is what they share; worker.py runs
inside the NVRx worker process. Kept import-free: worker.py is unpickled by reference there.
"""
