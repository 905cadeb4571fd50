#!/usr/bin/python3
"""bench_trainer: Lathe's trainer (lathectl train) vs an equivalent PyTorch eager loop.

Side by side in one run, alternating the two and repeating, for each configuration:
  digits  MLP 64-128-128-10, batch 64, Adam lr 1e-3, built-in digits set (1,797 samples)
  mnist   MLP 784-512-512-10, batch 128, Adam lr 1e-3, a synthetic MNIST-shaped IDX directory
          (8,192 random 28x28 uint8 training images + a small t10k set, written to a temp dir)

Both sides do the same per-step work, which is what Lathe's perf/samples_per_s times: set the
learning rate, gather a shuffled batch with index_select, zero_grad, forward, cross_entropy,
backward, optimizer step, loss.item(), and the running-accuracy argmax(...).sum().item() that
Lathe's step loop also does. Only the step loop is timed (not validation, shuffling or metric
recording). Lathe records per epoch; the first epoch of every run is treated as warm-up and
dropped on both sides, and throughput is (samples over the remaining epochs) / (their step
time). The median over the repeats is reported, and the ratio Lathe / PyTorch; then, since this
machine's speed drifts by tens of percent between runs, the ratio of each back-to-back pair
(median and range) and each side's run-to-run spread ((max - min) / median): a ratio is to be
trusted only as far as the pair range allows. The step's phases (data, forward, backward,
optimizer) are reported per side in ms per step: Lathe's from its perf/*_ms metrics, PyTorch's
timed at the same boundaries in the loop here.

Both sides run in the same environment (OMP_* / OPENBLAS_* inherited), with T threads:
`--threads T` for lathectl, which sets LibTorch's intra-op threads and OpenBLAS's pool, and
here `torch.set_num_threads(T)` plus `openblas_set_num_threads(T)` through ctypes, so both
sides compute with the same number of BLAS threads. Lathe runs with recording on
(`--db TMP --log-every 10`), so its batched SQLite writer thread is part of what is measured.

Exit codes: 0 = measured (whatever the ratios), 1 = something broke (a run failed, output
unparseable), 2 = bad arguments, 77 = skipped (this Python has no torch).
"""
import argparse
import gzip
import json
import math
import os
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.normpath(os.path.join(HERE, "..", ".."))
VAL_SPLIT = 0.2  # lathectl's default val_split
PHASES = ("data", "forward", "backward", "optimizer")  # a step's parts, as lathectl's perf/*_ms


class Broken(Exception):
    """Something failed that is not a slow result: exit 1."""


# ---- data ------------------------------------------------------------------------------------

def write_idx(directory, n_train, n_test, seed):
    """A synthetic MNIST-shaped IDX directory: random 28x28 uint8 images, labels 0..9."""
    import random
    rng = random.Random(seed)
    os.makedirs(directory, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        with open(os.path.join(directory, prefix + "-images-idx3-ubyte"), "wb") as f:
            f.write(struct.pack(">IIII", 0x00000803, n, 28, 28))
            f.write(rng.randbytes(n * 28 * 28))
        with open(os.path.join(directory, prefix + "-labels-idx1-ubyte"), "wb") as f:
            f.write(struct.pack(">II", 0x00000801, n))
            f.write(bytes(rng.randrange(10) for _ in range(n)))


def read_idx_train(directory, torch):
    with open(os.path.join(directory, "train-images-idx3-ubyte"), "rb") as f:
        magic, n, rows, cols = struct.unpack(">IIII", f.read(16))
        if magic != 0x00000803:
            raise Broken("bad IDX image magic")
        px = bytearray(f.read(n * rows * cols))
    with open(os.path.join(directory, "train-labels-idx1-ubyte"), "rb") as f:
        magic, n2 = struct.unpack(">II", f.read(8))
        if magic != 0x00000801 or n2 != n:
            raise Broken("bad IDX label file")
        labels = bytearray(f.read(n))
    x = torch.frombuffer(px, dtype=torch.uint8).reshape(n, 1, rows, cols).float().div_(255.0)
    y = torch.frombuffer(labels, dtype=torch.uint8).long()
    return x.contiguous(), y.contiguous()


def read_digits_train(torch, seed):
    """The digits set as lathectl loads it (pixels / 16, shape [1, 8, 8]); the training share
    is as large as lathectl's (n - round(0.2 n)), so both sides run the same steps per epoch."""
    path = os.path.join(SOURCE_DIR, "resources", "data", "digits.csv.gz")
    rows = []
    with gzip.open(path, "rt") as f:
        for line in f:
            line = line.strip()
            if line:
                rows.append([float(v) for v in line.split(",")])
    x = torch.tensor([r[:64] for r in rows], dtype=torch.float32).div_(16.0).reshape(-1, 1, 8, 8)
    y = torch.tensor([int(r[64]) for r in rows], dtype=torch.int64)
    n = x.shape[0]
    n_val = min(max(int(round(VAL_SPLIT * n)), 1), n - 1)
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(n, generator=g)[n_val:]
    return x.index_select(0, idx).contiguous(), y.index_select(0, idx).contiguous()


# ---- the two sides ---------------------------------------------------------------------------

def run_lathe(lathectl, cfg, data_arg, threads, epochs, workdir, rep):
    db = os.path.join(workdir, "lathe-%s-t%d-%d.db" % (cfg["name"], threads, rep))
    cmd = [lathectl, "train", "--db", db, "--json", "-q",
           "--model", "mlp", "--hidden", ",".join(str(h) for h in cfg["hidden"]),
           "--data", data_arg, "--epochs", str(epochs), "--batch", str(cfg["batch"]),
           "--lr", str(cfg["lr"]), "--optimizer", "adam", "--seed", str(1 + rep),
           "--threads", str(threads), "--log-every", "10"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise Broken("lathectl train failed (exit %d): %s\n%s" % (p.returncode, " ".join(cmd), p.stderr.strip()))
    try:
        res = json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as e:
        raise Broken("lathectl train printed no JSON line (%s): %r" % (e, p.stdout[-500:]))
    if res.get("status") != "completed":
        raise Broken("lathectl run %s ended %r: %s" % (res.get("run_id"), res.get("status"), res.get("error", "")))
    for key in ("run_id", "perf/samples_per_s", "train/loss"):
        if key not in res:
            raise Broken("lathectl JSON lacks %r: %r" % (key, res))
    if not math.isfinite(res["train/loss"]):
        raise Broken("lathectl run %s: loss %r" % (res["run_id"], res["train/loss"]))
    # Per-epoch throughput from the workspace, to drop the warm-up epoch like the PyTorch side,
    # and the step's phases (perf/*_ms: mean ms per step of each epoch, timed without the profiler).
    m = subprocess.run([lathectl, "metrics", str(res["run_id"]), "--db", db, "--json"], capture_output=True,
                       text=True)
    if m.returncode != 0:
        raise Broken("lathectl metrics failed: %s" % m.stderr.strip())
    try:
        metrics = json.loads(m.stdout)["metrics"]
        per_epoch = [float(pt["value"]) for pt in metrics["perf/samples_per_s"]]
        phases = {}
        for phase in PHASES:
            vals = [float(pt["value"]) for pt in metrics.get("perf/%s_ms" % phase, [])]
            if len(vals) != epochs:
                raise Broken("lathectl recorded %d perf/%s_ms points for %d epochs" % (len(vals), phase, epochs))
            phases[phase] = statistics.mean(vals[1:])
    except (ValueError, KeyError, TypeError) as e:
        raise Broken("cannot parse lathectl metrics output (%s): %r" % (e, m.stdout[:500]))
    if len(per_epoch) != epochs:
        raise Broken("lathectl recorded %d perf/samples_per_s points for %d epochs" % (len(per_epoch), epochs))
    if per_epoch[-1] != res["perf/samples_per_s"]:
        raise Broken("recorded perf/samples_per_s differs from the run's final value")
    for ext in ("", "-wal", "-shm"):
        try:
            os.remove(db + ext)
        except OSError:
            pass
    shutil.rmtree(os.path.join(workdir, "artifacts"), ignore_errors=True)
    return {"per_epoch": per_epoch, "final": res["perf/samples_per_s"], "steps": res.get("steps"),
            "loss": res["train/loss"], "process_wall_s": wall, "phases_ms": phases}


def set_openblas_threads(threads):
    """What lathectl --threads does: OpenBLAS keeps its own pool whatever torch.set_num_threads says."""
    import ctypes
    # torch loads BLAS with RTLD_LOCAL, so look the library up by name (the handle is the
    # one already loaded).
    for name in (None, "libopenblas.so.0"):
        try:
            ctypes.CDLL(name).openblas_set_num_threads(ctypes.c_int(threads))
            return
        except (AttributeError, OSError):
            continue  # not OpenBLAS (reference BLAS, MKL): nothing to align


def run_torch(torch, cfg, x, y, threads, epochs, rep):
    import torch.nn as nn
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    set_openblas_threads(threads)
    torch.manual_seed(1 + rep)
    layers = [nn.Flatten()]
    width = x[0].numel()
    for h in cfg["hidden"]:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, 10))
    model = nn.Sequential(*layers)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    n, batch = x.shape[0], cfg["batch"]
    steps = (n + batch - 1) // batch
    g = torch.Generator().manual_seed(1000 + rep)
    per_epoch = []
    phase_s = [0.0] * len(PHASES)
    loss_value = float("nan")
    clock = time.perf_counter
    for epoch in range(epochs):
        perm = torch.randperm(n, generator=g)
        step_s, seen, correct = 0.0, 0, 0
        for b in range(steps):
            # The phases as lathectl times them: data, forward (with zero_grad and the loss),
            # backward (with the loss and accuracy reads), optimizer.
            t0 = clock()
            for group in opt.param_groups:
                group["lr"] = cfg["lr"]
            idx = perm[b * batch:min(n, (b + 1) * batch)]
            xb = x.index_select(0, idx)
            yb = y.index_select(0, idx)
            t1 = clock()
            opt.zero_grad()
            out = model(xb)
            loss = F.cross_entropy(out, yb)
            t2 = clock()
            loss.backward()
            loss_value = loss.item()
            correct += out.detach().argmax(1).eq(yb).sum().item()
            t3 = clock()
            opt.step()
            t4 = clock()
            step_s += t4 - t0
            if epoch > 0:
                for k, (a, c) in enumerate(((t0, t1), (t1, t2), (t2, t3), (t3, t4))):
                    phase_s[k] += c - a
            seen += idx.shape[0]
        per_epoch.append(seen / max(step_s, 1e-9))
    if not math.isfinite(loss_value):
        raise Broken("PyTorch loop: loss %r" % loss_value)
    params = sum(p.numel() for p in model.parameters())
    timed = steps * (epochs - 1)
    return {"per_epoch": per_epoch, "final": per_epoch[-1], "steps": steps * epochs, "loss": loss_value,
            "parameters": params, "phases_ms": {p: 1000.0 * t / max(timed, 1) for p, t in zip(PHASES, phase_s)}}


def steady(per_epoch):
    """Throughput over all epochs but the first (warm-up): every epoch has the same samples, so
    total samples / total step time is the harmonic mean of the per-epoch rates."""
    rates = per_epoch[1:] if len(per_epoch) > 1 else per_epoch
    return len(rates) / sum(1.0 / r for r in rates)


# ---- main ------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lathectl", required=True, help="path to the lathectl binary")
    ap.add_argument("--out", help="directory for bench_trainer.json")
    ap.add_argument("--quick", action="store_true", help="fewer epochs (CTest: well under 60 s)")
    ap.add_argument("--repeats", type=int,
                    help="alternating Lathe/PyTorch pairs per configuration (default 5, quick 3)")
    ap.add_argument("--threads", default="1", help="comma-separated thread counts, e.g. 1,2")
    ap.add_argument("--configs", default="digits,mnist", help="comma-separated: digits, mnist")
    ap.add_argument("--epochs-digits", type=int, help="epochs per digits run (default 40, quick 15)")
    ap.add_argument("--epochs-mnist", type=int, help="epochs per mnist run (default 6, quick 3)")
    args = ap.parse_args()
    if args.repeats is None:
        args.repeats = 3 if args.quick else 5

    try:
        threads = [int(t) for t in args.threads.split(",") if t.strip()]
        configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    except ValueError:
        print("bench_trainer: --threads takes integers, e.g. 1,2", file=sys.stderr)
        return 2
    known = {"digits", "mnist"}
    if not threads or any(t < 1 for t in threads) or not configs or set(configs) - known or args.repeats < 1:
        print("bench_trainer: bad --threads/--configs/--repeats", file=sys.stderr)
        return 2
    if not (os.path.isfile(args.lathectl) and os.access(args.lathectl, os.X_OK)):
        print("bench_trainer: lathectl not found or not executable: %s" % args.lathectl, file=sys.stderr)
        return 1

    try:
        import torch
    except ImportError as e:
        print("bench_trainer: SKIPPED: %s (%s) cannot import torch (%s); install Debian's python3-torch "
              "and run with /usr/bin/python3" % (sys.executable, platform.python_version(), e))
        return SKIP

    ep_digits = args.epochs_digits or (15 if args.quick else 40)
    ep_mnist = args.epochs_mnist or (3 if args.quick else 6)
    if min(ep_digits, ep_mnist) < 2:
        print("bench_trainer: need at least 2 epochs (the first is warm-up)", file=sys.stderr)
        return 2

    env_keys = sorted(k for k in os.environ if k.startswith(("OMP_", "OPENBLAS_", "MKL_", "GOTO", "KMP_")))
    print("bench_trainer: torch %s (%s), lathectl %s, %d CPUs, repeats %d%s" %
          (torch.__version__, sys.executable, args.lathectl, os.cpu_count() or 0, args.repeats,
           ", quick" if args.quick else ""))
    print("environment: " + (", ".join("%s=%s" % (k, os.environ[k]) for k in env_keys) or "no OMP_/OPENBLAS_ settings"))

    sys.stdout.flush()

    t_start = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory(prefix="lathe-bench-trainer-") as work:
        cfgs = {
            "digits": {"name": "digits", "desc": "MLP 64-128-128-10, batch 64, Adam, digits (1797)",
                       "hidden": [128, 128], "batch": 64, "lr": 1e-3, "epochs": ep_digits},
            "mnist": {"name": "mnist", "desc": "MLP 784-512-512-10, batch 128, Adam, IDX 8192x28x28",
                      "hidden": [512, 512], "batch": 128, "lr": 1e-3, "epochs": ep_mnist},
        }
        for name in configs:
            cfg = cfgs[name]
            if name == "digits":
                data_arg = "digits"
                x, y = read_digits_train(torch, 7)
            else:
                idx_dir = os.path.join(work, "idx")
                write_idx(idx_dir, 8192, 512, seed=7)
                data_arg = "idx:" + idx_dir
                x, y = read_idx_train(idx_dir, torch)
            for t in threads:
                lathe_runs, torch_runs = [], []
                for rep in range(args.repeats):
                    # Alternate which side goes first so neither always runs on a "cold" machine.
                    order = ("lathe", "torch") if rep % 2 == 0 else ("torch", "lathe")
                    for side in order:
                        if side == "lathe":
                            r = run_lathe(args.lathectl, cfg, data_arg, t, cfg["epochs"], work, rep)
                            lathe_runs.append(r)
                        else:
                            r = run_torch(torch, cfg, x, y, t, cfg["epochs"], rep)
                            torch_runs.append(r)
                        print("  %-6s T=%d rep %d %-7s %10.0f samples/s (steady)" %
                              (name, t, rep + 1, side, steady(r["per_epoch"])))
                        sys.stdout.flush()
                if lathe_runs[0]["steps"] != torch_runs[0]["steps"]:
                    raise Broken("%s: Lathe ran %s steps, the PyTorch loop %s: the setups differ" %
                                 (name, lathe_runs[0]["steps"], torch_runs[0]["steps"]))
                lr_ = [steady(r["per_epoch"]) for r in lathe_runs]
                tr_ = [steady(r["per_epoch"]) for r in torch_runs]
                lm, tm = statistics.median(lr_), statistics.median(tr_)
                lb, tb = max(lr_), max(tr_)
                # Each pair ran back to back: its ratio sees the same machine state, so the spread
                # of the pair ratios says how far one ratio can be trusted on this machine.
                pair = [a / b for a, b in zip(lr_, tr_)]
                phases = {side: {p: statistics.median(r["phases_ms"][p] for r in runs) for p in PHASES}
                          for side, runs in (("lathe", lathe_runs), ("torch", torch_runs))}
                results.append({
                    "config": name, "description": cfg["desc"], "threads": t, "epochs": cfg["epochs"],
                    "batch": cfg["batch"], "train_samples": int(x.shape[0]),
                    "steps_per_run": torch_runs[0]["steps"], "parameters": torch_runs[0]["parameters"],
                    "lathe_samples_per_s": lm, "torch_samples_per_s": tm, "ratio": lm / tm,
                    "lathe_best_samples_per_s": lb, "torch_best_samples_per_s": tb, "ratio_best": lb / tb,
                    "pair_ratios": pair, "pair_ratio_median": statistics.median(pair),
                    "pair_ratio_min": min(pair), "pair_ratio_max": max(pair),
                    "lathe_spread": (max(lr_) - min(lr_)) / lm, "torch_spread": (max(tr_) - min(tr_)) / tm,
                    "phases_ms": phases,
                    "lathe_runs": lathe_runs, "torch_runs": torch_runs,
                })
    total = time.perf_counter() - t_start

    print()
    print("samples/s over the step loop, warm-up epoch dropped; median of %d runs each "
          "(best run in brackets)" % args.repeats)
    print("%-52s %3s %20s %20s" % ("configuration", "T", "Lathe", "PyTorch eager"))
    print("-" * 98)
    for r in results:
        print("%-52s %3d %10.0f (%7.0f) %10.0f (%7.0f)" % (
            r["description"], r["threads"], r["lathe_samples_per_s"], r["lathe_best_samples_per_s"],
            r["torch_samples_per_s"], r["torch_best_samples_per_s"]))
    print("-" * 98)
    print()
    print("step phases, ms per step (median of the runs; Lathe's perf/*_ms metrics, timed the same way here)")
    print("%-8s %3s %-8s %8s %8s %8s %9s %9s" % ("config", "T", "side", "data", "forward", "backward", "optimizer",
                                               "opt share"))
    for r in results:
        for side in ("lathe", "torch"):
            ph = r["phases_ms"][side]
            step_ms = sum(ph.values())
            print("%-8s %3d %-8s %8.4f %8.4f %8.4f %9.4f %8.1f%%" % (
                r["config"], r["threads"], side, ph["data"], ph["forward"], ph["backward"], ph["optimizer"],
                100.0 * ph["optimizer"] / step_ms if step_ms > 0 else 0.0))
    print()
    for r in results:
        print("ratio Lathe/PyTorch  %-7s T=%d : %.2fx  (best runs: %.2fx; back-to-back pairs: median %.2fx, "
              "range %.2f-%.2fx; run-to-run spread Lathe %.0f%%, PyTorch %.0f%%)" % (
                  r["config"], r["threads"], r["ratio"], r["ratio_best"], r["pair_ratio_median"],
                  r["pair_ratio_min"], r["pair_ratio_max"], 100 * r["lathe_spread"], 100 * r["torch_spread"]))
    print("(total %.1f s)" % total)

    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "bench_trainer.json")
        with open(path, "w") as f:
            json.dump({"name": "bench_trainer", "torch_version": torch.__version__, "python": sys.executable,
                       "lathectl": args.lathectl, "quick": args.quick, "repeats": args.repeats,
                       "cpus": os.cpu_count(), "environment": {k: os.environ[k] for k in env_keys},
                       "total_seconds": total, "results": results,
                       "ratios": {"%s_t%d" % (r["config"], r["threads"]): r["ratio"] for r in results}},
                      f, indent=2)
        print("results: " + path)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Broken as e:
        print("bench_trainer: FAILED: %s" % e, file=sys.stderr)
        sys.exit(1)
