"""Fix 1, the checkpoint fence (families `nvrx` and `megatron`).

nvrx.py and megatron.py declare what is wrapped; fence.py waits for the pending saves that hold GPU
memory; release.py makes a writer let go of CUDA storage (door.py: its side door, while a write goes
on); shm_drain.py keeps NVRx's own /dev/shm drain installed across closes; advice.py is what doctor
says about it; state.py is what they share; worker.py runs inside the NVRx worker process. Kept
import-free: worker.py is unpickled by reference there.
"""
