"""The MLP of a pipetrain config trained as a pipeline of processes in
PyTorch: one process per stage over torch.distributed (gloo, loopback), each
holding a contiguous slice of the layers, a fill-drain (GPipe) schedule: the
forwards of all micro-batches, activations sent on with isend and received
with recv, then the backwards of all micro-batches (the last first),
gradients sent back the same way, then each stage's SGD-with-momentum step.
The loss is the mean of the micro-batch losses, their gradients summed, as in
mlp.py. Rank 0 prints one JSON line: the median step time after the warm-up
(from the start of one of its steps to the start of the next, the pipeline's
period) and samples/s.

    python3 bench/pytorch/pipeline.py --hidden 512,512,512,512 --batch 128 --micro-batches 4 \
        --stages 4 --split 0,1,2,3-4 --steps 60 --skip 10 --threads 1

Run as above, the script is the launcher: it starts --stages copies of
itself (RANK set in each one's environment) on a free loopback port, waits
for them, and kills the rest as soon as one fails or it is itself
interrupted; each copy also dies with the launcher (PR_SET_PDEATHSIG).
Random inputs stand in for Fashion-MNIST, as in mlp.py.
"""
import argparse
import ctypes
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--input", type=int, default=784)
    p.add_argument("--hidden", default="512,512,512,512")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--micro-batches", type=int, default=4)
    p.add_argument("--stages", type=int, default=4)
    p.add_argument("--split", default="", help="each stage's layers, e.g. 0-1,2-3,4-5,6-8 (default: equal layer counts)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--skip", type=int, default=10)
    p.add_argument("--threads", type=int, default=1, help="BLAS threads per process")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--timeout", type=float, default=600, help="seconds before the launcher gives up")
    a = p.parse_args()
    if a.steps <= a.skip:
        p.error("--steps must exceed --skip")
    return a


def layer_ranges(a, n_layers):
    """Each stage's [first, last] layer indices."""
    if not a.split:
        return [(s * n_layers // a.stages, (s + 1) * n_layers // a.stages - 1) for s in range(a.stages)]
    out = []
    for part in a.split.split(","):
        first, _, last = part.partition("-")
        out.append((int(first), int(last or first)))
    if len(out) != a.stages or out[0][0] != 0 or out[-1][1] != n_layers - 1 or any(
            out[i][1] + 1 != out[i + 1][0] or out[i][0] > out[i][1] for i in range(len(out) - 1)):
        raise SystemExit(f"--split {a.split!r} does not cut {n_layers} layers into {a.stages} contiguous stages")
    return out


# ---- launcher ----

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(a):
    layer_ranges(a, len([h for h in a.hidden.split(",") if h]) + 1)  # a bad --split fails here, once
    port = os.environ.get("MASTER_PORT") or str(free_port())
    n = str(a.threads)
    procs = []

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    rc = 0
    try:
        for rank in range(a.stages):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(a.stages), MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                       OPENBLAS_NUM_THREADS=n, OMP_NUM_THREADS=n, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
                       PIPELINE_PY_WORKER="1")
            procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + sys.argv[1:], env=env,
                                          stdout=None if rank == 0 else subprocess.DEVNULL))
        deadline = time.monotonic() + a.timeout
        while True:
            codes = [p.poll() for p in procs]
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                r, c = failed[0]
                print(f"pipeline.py: rank {r} exited with {c}", file=sys.stderr)
                rc = 1
                break
            if all(c == 0 for c in codes):
                break
            if time.monotonic() > deadline:
                print(f"pipeline.py: timed out after {a.timeout:.0f}s", file=sys.stderr)
                rc = 1
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait()
    return rc


# ---- one stage ----

def die_with_parent():
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    if os.getppid() == 1:  # the launcher is already gone
        os._exit(1)


def worker(a):
    die_with_parent()
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)

    torch.manual_seed(1)
    sizes = [a.input] + [int(h) for h in a.hidden.split(",") if h] + [a.classes]
    n_layers = len(sizes) - 1
    # Every rank builds the whole model from the same seed and keeps its slice.
    full = [torch.nn.Linear(sizes[i], sizes[i + 1]) for i in range(n_layers)]
    first, last = layer_ranges(a, n_layers)[rank]
    mods = []
    for i in range(first, last + 1):
        mods.append(full[i])
        if i < n_layers - 1:
            mods.append(torch.nn.ReLU())
    stage = torch.nn.Sequential(*mods)
    del full
    opt = torch.optim.SGD(stage.parameters(), lr=a.lr, momentum=a.momentum)
    loss_fn = torch.nn.CrossEntropyLoss()
    M = a.micro_batches
    mb = a.batch // M
    in_width, out_width = sizes[first], sizes[last + 1]
    is_first, is_last = rank == 0, rank == world - 1
    x = torch.randn(a.steps, M, mb, a.input) if is_first else None
    y = torch.randint(0, a.classes, (a.steps, M, mb)) if is_last else None

    times = []
    for step in range(a.steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        pending = []
        inputs, outputs = [], []
        # Fill: every micro-batch's forward.
        for m in range(M):
            if is_first:
                inp = x[step, m]
            else:
                inp = torch.empty(mb, in_width)
                dist.recv(inp, src=rank - 1)
                inp.requires_grad_(True)
            out = stage(inp)
            if is_last:
                out = loss_fn(out, y[step, m]) / M
            else:
                pending.append(dist.isend(out.detach(), dst=rank + 1))
            inputs.append(inp)
            outputs.append(out)
        # Drain: every micro-batch's backward, the last first.
        for m in reversed(range(M)):
            if is_last:
                outputs[m].backward()
            else:
                g = torch.empty(mb, out_width)
                dist.recv(g, src=rank + 1)
                outputs[m].backward(g)
            if not is_first:
                pending.append(dist.isend(inputs[m].grad, dst=rank - 1))
            inputs[m] = outputs[m] = None
        opt.step()
        for w in pending:
            w.wait()
        times.append(time.perf_counter() - start)
    dist.barrier()
    if is_first:
        ms = statistics.median(times[a.skip:]) * 1e3
        print(json.dumps({"samples_per_sec": a.batch / ms * 1e3, "ms_per_step": ms, "stages": world,
                          "split": [f"{f}-{l}" if l > f else str(f) for f, l in layer_ranges(a, n_layers)],
                          "threads": a.threads, "torch": torch.__version__}), flush=True)
    dist.destroy_process_group()


def main():
    a = parse_args()
    if os.environ.get("PIPELINE_PY_WORKER") == "1":
        worker(a)
        return 0
    return launch(a)


if __name__ == "__main__":
    sys.exit(main())
