"""Zero every cubin of a shared library's .nv_fatbin section except one GPU architecture's.

Transformer Engine's cu13 core library is 559 MB, 516 MB of it cubins for sm_75/80/89/90/100/103/120: 186 MB as a
wheel, three device calls on its own. The H200 loads only the sm_90 cubins, so the others are overwritten with zeros
(xz then stores them as nothing: 11 MB). Headers and sizes stay as they are, so every offset in the ELF file stays
valid; a container that has no cubin of the kept architecture is left whole, so nothing the card could load is lost.

    python fatbin_keep.py LIB.so 90
"""

import struct
import subprocess
import sys

MAGIC = 0xBA55ED50


def fatbin_section(path):
    out = subprocess.run(["readelf", "-SW", path], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if ".nv_fatbin" in line.split():
            cols = line.split()
            i = cols.index(".nv_fatbin")
            return int(cols[i + 3], 16), int(cols[i + 4], 16)
    raise SystemExit(f"{path}: no .nv_fatbin section")


def entries(buf, start, size):
    """(container start, [(kind, arch, payload offset, payload size)]) for each fatbin container."""
    pos, end = start, start + size
    while pos < end:
        magic, _ver, hsz, fsz = struct.unpack_from("<IHHQ", buf, pos)
        if magic != MAGIC:
            pos += 8
            continue
        found, e, cend = [], pos + hsz, pos + hsz + fsz
        while e < cend:
            kind, _ev, ehs, padded = struct.unpack_from("<HHII", buf, e)
            arch = struct.unpack_from("<I", buf, e + 28)[0]
            found.append((kind, arch, e + ehs, padded))
            e += ehs + padded
        yield pos, found
        pos = cend


def keep_arch(path, arch):
    with open(path, "rb") as fh:
        buf = bytearray(fh.read())
    zeroed, whole = 0, 0
    for _pos, found in list(entries(buf, *fatbin_section(path))):
        if not any(kind == 2 and a == arch for kind, a, _, _ in found):
            whole += 1
            continue
        for _kind, a, off, n in found:
            if a != arch:
                buf[off:off + n] = bytes(n)
                zeroed += n
    with open(path, "wb") as fh:
        fh.write(buf)
    return zeroed, whole


if __name__ == "__main__":
    z, w = keep_arch(sys.argv[1], int(sys.argv[2]))
    print(f"zeroed {z / 2**20:.1f} MiB of other architectures' cubins; "
          f"{w} containers without sm_{sys.argv[2]} kept whole")
