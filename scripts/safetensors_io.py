"""Deterministic safetensors writing and checked reading for the data and fixture scripts.

The official `safetensors` package writes metadata in hash-map order, so regenerating a file
could change its bytes without changing its content. This writer lays files out as the mgn
runtime does (`runtime/src/checkpoint/`): the `__metadata__` entry first with sorted keys, then
the tensors ordered by decreasing element size and then name, the header padded with spaces to a
multiple of 8. Every file written is read back with the official package and compared.
"""

import json
import os
import struct

import numpy as np

_DTYPES = {
    np.dtype("float32"): "F32",
    np.dtype("float16"): "F16",
    np.dtype("int32"): "I32",
    np.dtype("int64"): "I64",
    np.dtype("uint32"): "U32",
    np.dtype("bool"): "BOOL",
}


def to_bytes(tensors, metadata):
    """The bytes of a safetensors file; `tensors` maps names to NumPy arrays."""
    items = []
    for name, array in tensors.items():
        array = np.asarray(array).copy(order="C")  # (np.ascontiguousarray would make a 0-d array 1-d)
        if array.dtype not in _DTYPES:
            raise ValueError(f"tensor {name!r}: unsupported dtype {array.dtype}")
        items.append((name, array))
    items.sort(key=lambda item: (-item[1].dtype.itemsize, item[0]))

    header = {"__metadata__": dict(sorted((str(k), str(v)) for k, v in metadata.items()))}
    offset = 0
    for name, array in items:
        end = offset + array.nbytes
        header[name] = {"dtype": _DTYPES[array.dtype], "shape": list(array.shape), "data_offsets": [offset, end]}
        offset = end
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    parts = [struct.pack("<Q", len(text)), text]
    parts += [array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes() for _, array in items]
    return b"".join(parts)


def save(path, tensors, metadata):
    """Writes `tensors` atomically, after checking the new file with the official reader."""
    data = to_bytes(tensors, metadata)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        loaded, meta = load(tmp)
        assert meta == {str(k): str(v) for k, v in metadata.items()}, f"{path}: metadata did not round-trip"
        assert loaded.keys() == tensors.keys(), f"{path}: tensor names did not round-trip"
        for name, array in tensors.items():
            got = loaded[name]
            assert got.dtype == array.dtype and got.shape == array.shape, f"{path}: {name} changed on reading back"
            assert np.array_equal(got, array), f"{path}: {name} values changed on reading back"
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def load(path):
    """(tensors, metadata) read with the official `safetensors` package."""
    from safetensors import safe_open
    from safetensors.numpy import load as load_bytes

    with open(path, "rb") as f:
        # `safetensors.numpy.load` keeps 0-d tensors 0-d (`safe_open(...).get_tensor` gives them shape (1,)).
        tensors = load_bytes(f.read())
    with safe_open(path, framework="numpy") as f:
        metadata = f.metadata() or {}
    return tensors, metadata
