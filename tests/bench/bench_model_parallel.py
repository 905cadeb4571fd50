#!/usr/bin/python3
"""bench_model_parallel: the pipeline's bubble and activation memory, and the tensor-parallel step, as `lathectl train` records them.

Every figure comes from the pipe/* metrics of real `lathectl train --pipeline-stages S` runs (one
process per stage, Gloo on loopback, 1 compute thread each):

  bubble   MLP 64-1024-1024-1024-10 on digits, batch 512, 2 stages, 1F1B, M = 1, 4, 8, 16
           micro-batches: pipe/bubble (1 - the stage's forward and backward compute time / the
           step's pipeline time, averaged over the stages), median over the run's steps after the
           first, against the theoretical (S-1)/(M+S-1) of equal stages with free communication.
  memory   MLP 64-1024x4-10, batch 512, 4 stages, M = 8, GPipe against 1F1B: per stage the
           micro-batches whose activations were held at once (pipe/stage<s>/in_flight) and the
           peak tensor memory of the second epoch's first step, when the gradients already exist
           (pipe/stage<s>/activation_mb, LibTorch's CPU allocator).
  tensor   MLP 64-4096-4096-10 on digits, batch 256: perf/step_ms of --tensor-parallel 2 (two
           processes, 1 thread each) against one process with 2 threads and with 1 thread, run
           alternately, median of the runs' epoch means.

Exit codes: 0 measured (whatever the figures), 1 something broke, 2 bad arguments.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

COMMON = ["--seed", "7", "--checkpoint-every", "0"]
# Two stages of equal weight (64-1024 + 1024-1024 | 1024-1024 + 1024-10 by parameters), so the
# bubble is the schedule's, not an imbalance's; batch 512 keeps 16 micro-batches of 32 rows busy.
NET = ["--hidden", "1024,1024,1024", "--batch", "512", "--threads", "1"]
# Four stages (one hidden layer each) for the memory comparison.
NET4 = ["--hidden", "1024,1024,1024,1024", "--batch", "512", "--threads", "1"]


def train(lathectl, db, args, net=NET):
    cmd = [lathectl, "train", "--db", db, "--json", "-q"] + COMMON + net + args
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("bench_model_parallel: %s failed (%d): %s %s" % (" ".join(cmd), p.returncode,
                                                                     p.stderr.strip(), p.stdout.strip()))
    return json.loads(p.stdout)["run_id"]


def series(lathectl, db, run_id, key):
    m = subprocess.run([lathectl, "metrics", str(run_id), "--key", key, "--json", "--db", db],
                       capture_output=True, text=True)
    if m.returncode != 0:
        raise SystemExit("bench_model_parallel: reading %s of run %s failed: %s" % (key, run_id, m.stderr.strip()))
    values = [float(pt["value"]) for pt in json.loads(m.stdout)["metrics"].get(key, [])]
    if not values:
        raise SystemExit("bench_model_parallel: run %s recorded no %s" % (run_id, key))
    return values


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lathectl", required=True)
    ap.add_argument("--out", default=None, help="directory for bench_model_parallel.json")
    ap.add_argument("--epochs", type=int, default=6, help="epochs of the bubble and tensor runs (3 steps each at batch 512)")
    ap.add_argument("--quick", action="store_true", help="1 epoch, M = 1 and 4 only, memory with 2 stages, 1 repeat")
    ap.add_argument("--repeats", type=int, default=3, help="alternated repeats of the tensor-parallel runs")
    a = ap.parse_args()
    if not os.access(a.lathectl, os.X_OK):
        print("bench_model_parallel: %s is not executable" % a.lathectl, file=sys.stderr)
        return 2
    epochs = str(1 if a.quick else max(1, a.epochs))
    micro = [1, 4] if a.quick else [1, 4, 8, 16]
    repeats = 1 if a.quick else max(1, a.repeats)
    stages = 2
    result = {"quick": a.quick, "bubble": [], "memory": []}
    with tempfile.TemporaryDirectory(prefix="lathe-bench-pipeline-") as tmp:
        db = os.path.join(tmp, "bench.db")
        print("bubble: %d stages, 1f1b, MLP 64-1024x3-10, batch 512, %s epoch(s)" % (stages, epochs))
        print("%4s %10s %12s %10s" % ("M", "measured", "theoretical", "ratio"))
        for m in micro:
            run = train(a.lathectl, db, ["--pipeline-stages", str(stages), "--micro-batches", str(m),
                                         "--pipeline-schedule", "1f1b", "--epochs", epochs])
            bubble = series(a.lathectl, db, run, "pipe/bubble")
            measured = statistics.median(bubble[1:] if len(bubble) > 1 else bubble)
            theory = (stages - 1) / (m + stages - 1)
            result["bubble"].append({"micro_batches": m, "measured": measured, "theoretical": theory})
            print("%4d %10.3f %12.3f %10.2f" % (m, measured, theory, measured / theory))

        mem_stages = 2 if a.quick else 4
        print("memory: %d stages, M = 8, MLP 64-1024x4-10, batch 512, first step of epoch 2" % mem_stages)
        print("%-6s %5s %10s %14s" % ("sched", "stage", "in flight", "activation MB"))
        for schedule in ["gpipe", "1f1b"]:
            run = train(a.lathectl, db, ["--pipeline-stages", str(mem_stages), "--micro-batches", "8",
                                         "--pipeline-schedule", schedule, "--epochs", "2"], net=NET4)
            for s in range(mem_stages):
                in_flight = max(series(a.lathectl, db, run, "pipe/stage%d/in_flight" % s))
                mb = series(a.lathectl, db, run, "pipe/stage%d/activation_mb" % s)[-1]
                result["memory"].append({"schedule": schedule, "stage": s, "in_flight": in_flight,
                                         "activation_mb": mb})
                print("%-6s %5d %10d %14.2f" % (schedule, s, in_flight, mb))
        print("tensor: MLP 64-4096-4096-10, batch 256, %s epoch(s), %d alternated repeat(s)" % (epochs, repeats))
        tp_net = ["--hidden", "4096,4096", "--batch", "256", "--epochs", epochs]
        modes = [("1 process, 2 threads", ["--threads", "2"]),
                 ("1 process, 1 thread", ["--threads", "1"]),
                 ("tensor parallel 2 x 1 thread", ["--threads", "1", "--tensor-parallel", "2"])]
        times = {name: [] for name, _ in modes}
        for _ in range(repeats):
            for name, flags in modes:
                run = train(a.lathectl, db, tp_net + flags, net=[])
                times[name].append(statistics.median(series(a.lathectl, db, run, "perf/step_ms")))
        base = statistics.median(times[modes[0][0]])
        print("%-30s %10s %8s" % ("", "step ms", "vs 2 thr"))
        for name, _ in modes:
            ms = statistics.median(times[name])
            result.setdefault("tensor", []).append({"mode": name, "step_ms": ms, "ratio_to_2_threads": ms / base})
            print("%-30s %10.2f %8.2f" % (name, ms, ms / base))
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "bench_model_parallel.json"), "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
