#!/usr/bin/env bash
# The GPU check (docs/gpu.md), run on the GPU machine from the folder that
# make gpu-check fills here: ./run.sh OUT. It needs no Go: it checks the
# machine (nvidia-smi, libcuda, cuBLAS), runs the GPU tests (each kernel
# against float64, MLP chunks against the cpu engine), the sgemm and
# Dense-stage benchmarks and PyTorch's on the same GPU, and trains the MLP
# of mlp.yaml 50 steps on the cpu (pipetrain reference), with stage 1 on
# cuda:0 (mixed) and with both stages on cuda:0 (sharing it), comparing
# each step's loss with the reference's.
# Everything goes under OUT; each part has a time limit, all of them
# together 7.5 minutes (a minute or two when all goes well).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: run.sh OUT}
mkdir -p "$out" && out=$(cd "$out" && pwd)
exec > >(tee "$out/run.log") 2>&1
part() { echo "== $* ($(date -u +%T))"; }
failed=()

part machine
uname -a; nproc; free -g
nvidia-smi | tee "$out/nvidia-smi.txt" || failed+=(nvidia-smi)
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee -a "$out/nvidia-smi.txt"

part libraries
loader=$(ldconfig -p)
grep -E 'libcuda\.so|libcublas' <<<"$loader" | tee "$out/libraries.txt"
timeout 30 find / \( -path /proc -o -path /sys -o -path "$out" \) -prune -o -name 'libcublas.so*' -print 2>/dev/null | tee -a "$out/libraries.txt"
if [ -z "${PIPETRAIN_CUBLAS:-}" ] && ! grep -q 'libcublas\.so\.1[123] ' <<<"$loader"; then
	# Not on the loader's path: the first of the wheels' (pipetrain looks
	# under the usual site-packages itself, this covers the others).
	PIPETRAIN_CUBLAS=$(grep -E '/libcublas\.so\.1[123]$' "$out/libraries.txt" | head -1)
	export PIPETRAIN_CUBLAS
fi
echo "PIPETRAIN_CUBLAS=${PIPETRAIN_CUBLAS:-}"
ldd "$here/pipetrain" | tee -a "$out/libraries.txt"

part tests
timeout 120 "$here/cuda.test" -test.v -test.count 1 -test.run 'TestKernels|TestTrainsLikeTheEngine|TestRegistered' 2>&1 | tee "$out/tests.txt" | grep -E '^(---|===|ok|PASS|FAIL)|\.go:[0-9]+' | grep -v '^=== RUN' | head -80
grep -q '^PASS$' "$out/tests.txt" || failed+=(tests)
grep -q -- '--- SKIP' "$out/tests.txt" && failed+=(tests-skipped)

part benchmarks
timeout 90 "$here/cuda.test" -test.run '^$' -test.bench 'Sgemm|DenseStage' -test.benchtime 10x 2>&1 | tee "$out/bench.txt" || failed+=(benchmarks)

part pytorch
# The same products and Dense stage in PyTorch on the same GPU, float32
# without TF32 as pipetrain's: the peer docs/benchmarks.md compares with.
timeout 60 python3 - <<'PY' 2>&1 | tee "$out/torch-bench.txt" || failed+=(pytorch)
import time, torch
torch.backends.cuda.matmul.allow_tf32 = False
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))
def timed(f, reps=10):
    f(); torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        f()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps
for n in (1024, 2048, 4096, 8192):
    a, b = torch.full((n, n), 0.5, device="cuda"), torch.full((n, n), 0.5, device="cuda")
    s = timed(lambda: torch.mm(a, b))
    print("sgemm %d: %.0f GFLOP/s" % (n, 2 * n**3 / s / 1e9))
    layer = torch.nn.Linear(n, n, device="cuda")
    x, y = torch.rand(n, n), torch.randint(0, n, (n,))
    def step():
        loss = torch.nn.functional.cross_entropy(layer(x.cuda()), y.cuda())
        loss.backward()
        loss.item()
    s = timed(step)
    print("dense stage %d (input copied in, forward, loss, backward): %.0f GFLOP/s" % (n, 6 * n**3 / s / 1e9))
PY

part training
mkdir -p "$out/train" && cd "$out/train" || exit 1
cp "$here"/t10k-* "$here/mlp.yaml" .
sed 's/{layers: "2-3", address: 127.0.0.1:7302, device: cpu}/{layers: "2-3", address: 127.0.0.1:7302, device: "cuda:0"}/' mlp.yaml > mixed.yaml
sed 's/device: cpu}/device: "cuda:0"}/' mlp.yaml > cuda.yaml
timeout 60 "$here/pipetrain" reference --force --config mlp.yaml --run-dir ref > ref.log 2>&1 || failed+=(reference)
for run in mixed cuda; do
	timeout 45 "$here/pipetrain" launch --force --config $run.yaml --run-dir $run > $run.log 2>&1 || failed+=($run)
	tail -3 $run.log
done
python3 - <<'PY' | tee "$out/losses.txt"
import json
# The loss of each step within this relative tolerance of the cpu's
# (docs/gpu.md): float32 products summed in cuBLAS's order differ from
# OpenBLAS's by units in the last place, which 50 steps of training grow.
TOL = 1e-3
def losses(d):
    try:
        return [json.loads(l)["loss"] for l in open(d + "/metrics.jsonl")]
    except OSError as e:
        return str(e)
ref = losses("ref")
print("reference (cpu):", ref if isinstance(ref, str) else "%d steps, first %.6f, last %.6f" % (len(ref), ref[0], ref[-1]))
for run in ("mixed", "cuda"):
    got = losses(run)
    if isinstance(got, str) or isinstance(ref, str) or len(got) != len(ref) or not ref:
        print(run, "FAIL: no losses to compare:", got if isinstance(got, str) else len(got))
        continue
    rel = [abs(g - r) / abs(r) for g, r in zip(got, ref)]
    worst = max(range(len(rel)), key=rel.__getitem__)
    print("%s: %d steps, last loss %.6f, worst relative difference %.2e at step %d: %s" % (run, len(got), got[-1], rel[worst], worst + 1, "ok" if rel[worst] <= TOL else "FAIL (tolerance %g)" % TOL))
PY
grep -q FAIL "$out/losses.txt" && failed+=(losses)

part done
if [ ${#failed[@]} -gt 0 ]; then
	echo "failed: ${failed[*]}"
	exit 1
fi
echo "all parts passed"
