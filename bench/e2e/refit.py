"""Both ends of the colocated refit, as NeMo-RL streams it, and the check that it arrived whole.

Trainer side (`stream_weights_via_ipc_zmq_impl`): HF-named tensors packed at 512-byte alignment
into two ping-pong uint8 buffers, one REQ/ACK per buffer, then COMPLETE. Engine side
(`update_weights_via_ipc_zmq` in the worker extension): per buffer rebuild, slice, `load_weights`,
ACK; on COMPLETE `process_weights_after_loading`. On the GPU each buffer travels as a CUDA IPC
handle; in the CPU smoke as bytes, through the same sockets and the same slicing.

Both ends live here because they are one protocol: a change to the packing must change the
unpacking with it. Each side keeps the same float64 digest per HF name, so the harness can tell
a refit that delivered every tensor exactly from one that left a parameter stale. Nothing here
imports the engine or the site's extension: the extension imports this.
"""

from __future__ import annotations

import time

import torch

ALIGN = 512  # NeMo-RL packs tensors at 512-byte alignment
_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def rank_address(base: str, rank: int) -> str:
    """The ZMQ address of one trainer rank and the engine worker on its GPU (NeMo-RL keys it by the
    GPU's uuid; here by rank, rank i on GPU i on both sides). Rank 0 keeps the one-rank address."""
    return base if rank == 0 else f"{base.removesuffix('.sock')}_{rank}.sock"


def digest(t: torch.Tensor) -> list:
    """[sum, sum of squares] in float64: what both ends compare per HF name."""
    t = t.detach().reshape(-1)
    return [t.sum(dtype=torch.float64).item(), (t.double() ** 2).sum().item()]


# ---------------------------------------------------------------------------- trainer side

def stream_weights(st, address: str, buffer_size_bytes: int) -> dict:
    """NeMo-RL's stream_weights_via_ipc_zmq_impl: two ping-pong uint8 buffers of half the budget
    each, tensors packed at 512 bytes, one REQ/ACK per buffer, then COMPLETE. GPU: each buffer
    travels as a CUDA IPC handle (torch.multiprocessing.reductions.reduce_tensor); CPU smoke: as bytes.
    Returns per-HF-name digests of what was sent (the refit check) and timings."""
    import zmq

    from bench.e2e import convert

    t0 = time.perf_counter()
    if st.sock is None:
        st.sock = zmq.Context.instance().socket(zmq.REQ)
        st.sock.bind(address)
    names = list(convert.iter_hf_weights(st.model))
    total = sum(-(-t.numel() * t.element_size() // ALIGN) * ALIGN for _, t in names)
    largest = max(t.numel() * t.element_size() for _, t in names)
    size = max(largest + ALIGN, min(buffer_size_bytes // 2, total))
    device = "cuda" if st.gpu else "cpu"
    bufs = [torch.empty(size, dtype=torch.uint8, device=device) for _ in range(2)]
    digests, metas, used, which, waiting, sent = {}, [], 0, 0, False, 0

    def flush():
        nonlocal metas, used, which, waiting, sent
        buf = bufs[which]
        if st.gpu:
            from torch.multiprocessing.reductions import reduce_tensor

            torch.cuda.synchronize()
            payload = ("cuda", reduce_tensor(buf)[1])
        else:
            payload = ("bytes", buf[:used].numpy().tobytes())
        if waiting:
            assert st.sock.recv_pyobj() == "ACK"
        st.sock.send_pyobj((payload, metas, used))
        waiting, sent = True, sent + 1
        metas, used, which = [], 0, 1 - which

    for name, t in names:
        n = t.numel() * t.element_size()
        if used + n > size:
            flush()
        bufs[which][used:used + n].copy_(t.contiguous().reshape(-1).view(torch.uint8))
        metas.append((name, used, tuple(t.shape), str(t.dtype).removeprefix("torch.")))
        digests[name] = digest(t)
        used += -(-n // ALIGN) * ALIGN
    if metas:
        flush()
    if waiting:
        assert st.sock.recv_pyobj() == "ACK"
    st.sock.send_pyobj("COMPLETE")
    assert st.sock.recv_pyobj() == "DONE"
    bufs.clear()
    if st.gpu:
        torch.cuda.ipc_collect()  # the engine dropped its views: let the allocator reuse the blocks
    return {"digests": digests, "buffers": sent, "buffer_bytes": size, "stream_s": round(time.perf_counter() - t0, 3)}

# ---------------------------------------------------------------------------- engine side

def receive_weights(ext, address: str) -> bool:
    """NeMo-RL's update_weights_via_ipc_zmq: REP socket, per buffer rebuild/slice/load_weights/ACK."""
    import zmq

    sock = getattr(ext, "_e2e_sock", None)
    if sock is None:
        sock = ext._e2e_sock = zmq.Context.instance().socket(zmq.REP)
        sock.connect(address)
    model = ext.model_runner.model
    device = next(model.parameters()).device
    while True:
        msg = sock.recv_pyobj()
        if msg == "COMPLETE":
            break
        (kind, payload), metas, used = msg
        if kind == "cuda":
            from torch.multiprocessing.reductions import rebuild_cuda_tensor

            args = list(payload)
            args[6] = device.index if device.index is not None else torch.cuda.current_device()
            buf = rebuild_cuda_tensor(*args)
        else:
            buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        weights = []
        for name, offset, shape, dtype in metas:
            dt = getattr(torch, dtype)
            n = dt.itemsize
            for s in shape:
                n *= s
            weights.append((name, buf[offset:offset + n].view(dt).view(shape)))
        model.load_weights(weights=weights)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        del weights, buf
        sock.send_pyobj("ACK")
    _post_process(ext)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.ipc_collect()
    sock.send_pyobj("DONE")
    return True


def _post_process(ext) -> None:
    model = ext.model_runner.model
    try:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.utils import process_weights_after_loading
    except ImportError:  # the CPU smoke's engine (fake_engine.py)
        return
    device = next(model.parameters()).device
    with set_current_vllm_config(ext.model_runner.vllm_config):
        process_weights_after_loading(model, ext.model_config, device)


def weights_digest(model, info: dict, tp: tuple = (0, 1)) -> dict:
    """Per-HF-name [sum, sum of squares] (float64) of the weights the engine holds, slicing vLLM's
    fused qkv_proj / gate_up_proj by the shapes the trainer announced in prepare_refit_info;
    engine parameters the refit does not name are listed (a refit must cover every one).

    With tensor parallelism (`tp` = (rank, size) > 1 worker; GPU only) each worker holds a shard:
    its digest is its part of the sum (row shards: rows / size of each part; column shards: the whole
    local tensor; replicated tensors: counted by TP rank 0 only), and the driver adds the workers'
    parts, which equal the full tensor's digest because sums of disjoint shards add up."""
    out, uncovered = {}, []
    tp_rank, tp_size = tp
    for name, p in model.named_parameters():
        t = p.detach()
        if tp_size > 1 and tp_rank and getattr(p, "output_dim", None) is None and getattr(p, "input_dim", None) is None:
            t = t.new_zeros(t.shape)  # replicated: TP rank 0's copy is the one counted
        if name in info:
            rows = _rows(info[name], p, tp_size)
            out[name] = digest(t[:rows])  # vLLM pads vocab rows; the refit writes the real ones
            continue
        key = next((k for k in _FUSED if f".{k}." in name), None)
        if key is None:
            uncovered.append(name)
            continue
        offset = 0
        for part in _FUSED[key]:
            hf = name.replace(key, part)
            if hf not in info:
                uncovered.append(name)
                break
            rows = _rows(info[hf], p, tp_size)
            out[hf] = digest(t[offset:offset + rows])
            offset += rows
    return {"digests": out, "uncovered": uncovered, "tp": tp_size}


def _rows(announced, param, tp_size: int) -> int:
    """Rows of one HF tensor in this worker's parameter: all of them, or 1/tp of them where vLLM
    shards the parameter by rows (output_dim 0: column-parallel layers, the vocab)."""
    rows = announced[0][0]
    return rows // tp_size if tp_size > 1 and getattr(param, "output_dim", None) == 0 else rows
