"""Loads `pipetrain export` files into their PyTorch modules and runs them.

    forward.py EXPORT INPUT OUTPUT [EXPORT INPUT OUTPUT ...]

Each module is built from the export's metadata (model_spec) and loaded with
load_state_dict(strict=True): every tensor must be a parameter of the module,
with its shape. Its logits on INPUT's tensor "x" (token ids for a GPT, as
floats) are written to OUTPUT as "logits", one row per example (per token
for a GPT)."""
import json
import sys

import torch

import modules
import safetensors_io as st


def main(args):
    torch.set_num_threads(1)
    for export, inp, out in zip(args[0::3], args[1::3], args[2::3]):
        weights, meta = st.load(export)
        spec = json.loads(meta["model_spec"])
        dtype = next(iter(weights.values())).dtype
        model = modules.from_spec(spec).to(dtype)
        model.load_state_dict(weights, strict=True)
        x = st.load(inp)[0]["x"]
        if spec["name"] == "gpt":
            x = x.long()
        with torch.no_grad():
            logits = model(x)
        st.save(out, {"logits": logits.reshape(-1, logits.shape[-1])})


if __name__ == "__main__":
    main(sys.argv[1:])
