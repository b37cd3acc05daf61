"""The training loop and timing gpt.py and llama.py share: pipetrain
reference's step on random byte windows (the global batch split into
micro-batches with their gradients summed, the loss the mean of the
micro-batch losses; Adam), and the JSON line the bench suite reads."""
import json
import statistics
import time

import torch
import torch.nn.functional as F


def add_run_args(p, batch, micro_batches, steps, skip, lr):
    """Adds the run's flags, with a model's defaults, to parser p."""
    p.add_argument("--batch", type=int, default=batch)
    p.add_argument("--micro-batches", type=int, default=micro_batches)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--skip", type=int, default=skip)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--lr", type=float, default=lr)


def train_and_report(model, a, vocab, context):
    """Trains model a.steps steps and prints the median step after a.skip."""
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    mb = a.batch // a.micro_batches
    # Windows of context+1 random tokens: the inputs and their next-token targets.
    data = torch.randint(0, vocab, (a.steps, a.micro_batches, mb, context + 1))
    times = []
    for step in range(a.steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        for m in range(a.micro_batches):
            w = data[step, m]
            logits = model(w[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, vocab), w[:, 1:].reshape(-1)) / a.micro_batches
            loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
    ms = statistics.median(times[a.skip:]) * 1e3
    n_params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"samples_per_sec": a.batch / ms * 1e3, "ms_per_step": ms, "params": n_params,
                      "threads": a.threads, "torch": torch.__version__}))
