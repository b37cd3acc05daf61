"""The MLP of a pipetrain config trained in PyTorch the way `pipetrain
reference` trains it: the same layer sizes, the global batch split into the
same micro-batches with their gradients summed, the loss the mean of the
micro-batch losses, SGD with momentum. Prints one JSON line: the median step
time over the steps after the warm-up, and samples/s.

    python3 bench/pytorch/mlp.py --input 784 --hidden 512,512,512,512 --classes 10 \
        --batch 128 --micro-batches 4 --steps 200 --skip 20 --threads 1

Random inputs stand in for Fashion-MNIST: the time of a step does not depend
on the pixel values, and pipetrain's own data feed is timed separately.
"""
import argparse
import json
import statistics
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--input", type=int, default=784)
    p.add_argument("--hidden", default="512,512,512,512")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--micro-batches", type=int, default=4)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--skip", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    a = p.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    sizes = [a.input] + [int(h) for h in a.hidden.split(",") if h] + [a.classes]
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    loss_fn = torch.nn.CrossEntropyLoss()
    mb = a.batch // a.micro_batches
    x = torch.randn(a.steps, a.micro_batches, mb, a.input)
    y = torch.randint(0, a.classes, (a.steps, a.micro_batches, mb))

    times = []
    for step in range(a.steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        for m in range(a.micro_batches):
            loss = loss_fn(model(x[step, m]), y[step, m]) / a.micro_batches
            loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
    ms = statistics.median(times[a.skip:]) * 1e3
    print(json.dumps({"step_ms": ms, "samples_per_sec": a.batch / ms * 1e3,
                      "threads": a.threads, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
