"""One SGD step of an MLP that PyTorch initialises, for pipetrain to repeat
from the same weights (train.init_from).

    sgd_step.py DATA SIZES LR INIT AFTER [CLIP]

Seeds torch, builds modules.MLP(SIZES) (e.g. 8,7,6,3), writes its initial
state_dict to INIT, takes one SGD step at LR on the whole batch in DATA ("x",
and "y" as floats): cross-entropy averaged over the batch, as pipetrain's
loss is. With CLIP, clips the gradients with clip_grad_norm_(CLIP) before
the step. Writes the updated state_dict to AFTER, with the loss before the
step (and the norm clip_grad_norm_ returned) in its metadata."""
import sys

import torch

import modules
import safetensors_io as st


def main(data, sizes, lr, init, after, clip=None):
    torch.set_num_threads(1)
    torch.manual_seed(7)
    model = modules.MLP([int(s) for s in sizes.split(",")])
    st.save(init, model.state_dict())
    batch = st.load(data)[0]
    opt = torch.optim.SGD(model.parameters(), lr=float(lr))
    loss = torch.nn.functional.cross_entropy(model(batch["x"]), batch["y"].long())
    loss.backward()
    meta = {"loss": repr(loss.item())}
    if clip is not None:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float(clip))
        meta["grad_norm"] = repr(norm.item())
    opt.step()
    st.save(after, model.state_dict(), meta)


if __name__ == "__main__":
    main(*sys.argv[1:])
