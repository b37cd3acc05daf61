"""One SGD step of an MLP that PyTorch initialises, for pipetrain to repeat
from the same weights (train.init_from).

    sgd_step.py DATA SIZES LR INIT AFTER

Seeds torch, builds modules.MLP(SIZES) (e.g. 8,7,6,3), writes its initial
state_dict to INIT, takes one SGD step at LR on the whole batch in DATA ("x",
and "y" as floats): cross-entropy averaged over the batch, as pipetrain's
loss is. Writes the updated state_dict to AFTER, with the loss before the
step in its metadata."""
import sys

import torch

import modules
import safetensors_io as st


def main(data, sizes, lr, init, after):
    torch.set_num_threads(1)
    torch.manual_seed(7)
    model = modules.MLP([int(s) for s in sizes.split(",")])
    st.save(init, model.state_dict())
    batch = st.load(data)[0]
    opt = torch.optim.SGD(model.parameters(), lr=float(lr))
    loss = torch.nn.functional.cross_entropy(model(batch["x"]), batch["y"].long())
    loss.backward()
    opt.step()
    st.save(after, model.state_dict(), {"loss": repr(loss.item())})


if __name__ == "__main__":
    main(*sys.argv[1:])
