"""`python -m app.services.checkpoint_probe PATH`: describes a checkpoint as JSON on stdout, in a process of its own.

The server runs this in a child process it can time out and kill, so a huge, slow or hostile file never takes the
server down. Loading is `weights_only=True` (no code in the file runs) and memory-mapped (tensor data stays on disk:
only names, shapes and dtypes are read).
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

MAX_TENSORS = 5000


def describe(value: Any, name: str, tensors: list[dict[str, Any]]) -> str:
    """A short description of `value`; every tensor found below it is appended to `tensors`."""
    import torch

    if isinstance(value, torch.Tensor):
        if len(tensors) < MAX_TENSORS:
            tensors.append({"name": name, "shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch."),
                            "numel": value.numel()})  # fmt: skip
        return f"tensor {list(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    if isinstance(value, dict):
        for key, item in value.items():
            describe(item, f"{name}.{key}" if name else str(key), tensors)
        return f"dict of {len(value)}"
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            describe(item, f"{name}.{index}", tensors)
        return f"{type(value).__name__} of {len(value)}"
    return f"{type(value).__name__} {value!r}"[:200]


def probe(path: str) -> dict[str, Any]:

    try:
        state = load(path)
    except Exception as error:
        return {"error": explain(error)}
    tensors: list[dict[str, Any]] = []
    if not isinstance(state, dict):
        return {"keys": {"(root)": describe(state, "", tensors)}, "tensors": tensors, "parameters": None}
    keys = {str(key): describe(value, str(key), tensors) for key, value in state.items()}
    model = [t for t in tensors if t["name"].startswith("model.")]
    parameters = sum(t["numel"] for t in model) if "model" in state else None
    return {"keys": keys, "tensors": tensors, "parameters": parameters, "truncated": len(tensors) >= MAX_TENSORS}


def load(path: str) -> Any:
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as error:
        if "mmap can only be used" not in str(error):
            raise
    # The legacy (pre-zip) format cannot be memory-mapped; the server's memory watch bounds this load instead.
    return torch.load(path, map_location="cpu", weights_only=True)


def explain(error: Exception) -> str:
    text = str(error)
    refused = re.search(r"Unsupported global: GLOBAL (\S+)", text)
    if refused:
        return (f"it holds a Python object ({refused.group(1)}) that safe loading (weights_only=True) refuses, "
                "since loading it could run code")  # fmt: skip
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(error).__name__)
    return f"not a PyTorch checkpoint ({type(error).__name__}: {first[:300]})"


if __name__ == "__main__":
    print(json.dumps(probe(sys.argv[1])))
