"""Fix 1, the checkpoint fence (families `nvrx` and `megatron`).

nvrx.py and megatron.py declare what is wrapped; fence.py waits for the pending saves that hold GPU
memory; release.py makes a finalized writer let go of CUDA storage; stage.py stages GPU tensors
through /dev/shm instead (COLO_SHIM_NVRX_RELEASE=stage); advice.py is what doctor says about it;
state.py is what they share; worker.py runs inside the NVRx worker process. Kept import-free:
worker.py is unpickled by reference there.
"""
