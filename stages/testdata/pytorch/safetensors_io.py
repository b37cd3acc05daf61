"""safetensors by hand (the format is a little-endian u64 header length, a
JSON header, then the raw data), for machines without the safetensors package."""
import json
import struct

import torch

DTYPES = {"F32": torch.float32, "F64": torch.float64}


def load(path):
    """The file's tensors by name, and its metadata."""
    with open(path, "rb") as f:
        b = f.read()
    (n,) = struct.unpack("<Q", b[:8])
    header = json.loads(b[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    data = b[8 + n :]
    out = {}
    for name, e in header.items():
        lo, hi = e["data_offsets"]
        dtype = DTYPES[e["dtype"]]
        t = torch.frombuffer(bytearray(data[lo:hi]), dtype=dtype) if hi > lo else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(e["shape"])
    return out, meta


def save(path, tensors, meta=None):
    names = {v: k for k, v in DTYPES.items()}
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        b = t.numpy().tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if meta:
        header["__metadata__"] = meta
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
