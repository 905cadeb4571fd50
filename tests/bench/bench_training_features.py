#!/usr/bin/python3
"""bench_training_features: what activation checkpointing and the profiler cost, side by side.

Each comparison alternates runs of the same lathectl binary on the same data and seed, repeats
them, and reports medians and ratios (never a wall-clock threshold):

  checkpointing  a deep MLP (16 hidden layers of 1024, batch 256, Adam, fp32) on digits, with and
                 without --activation-checkpointing: activation memory (perf/activation_mb: the
                 heap's growth from a step's start to its peak, steady-state epochs) and step time
                 (perf/step_ms). Target: >= 40% less activation memory for <= 35% more step time.
  data parallel  the same global batch of 256 on the 784-512-512-10 MLP, one process with two
                 threads vs two ranks of 128 with one thread each (Gloo over loopback): step time
                 and samples/s. On a 2-core machine the
                 ranks share the cores, so this measures the distributed machinery's cost rather
                 than a speed-up.
  profiler       a 784-512-512-10 MLP, batch 128, on a synthetic MNIST-shaped IDX set: no profiler
                 (baseline), the profiler present but never attached ("off": --profile with a
                 schedule that waits past the run's end), and recording every step ("on":
                 wait 0, warmup 0, active 1, repeat 0). What it costs is measured here as the
                 wall time of the whole `lathectl train` process (start-up, training, spans
                 handed to the store and the store's flush at exit: everything a user waits
                 for), and also per step: the extra wall time divided by the run's steps, as a
                 share of the baseline's step time. perf/step_ms is printed as context only: it
                 is the trainer's own step timer, which can leave work out. Targets: off < 1%,
                 on < 10%.

Exit codes: 0 measured (whatever the ratios), 1 something broke, 2 bad arguments.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_trainer import write_idx  # noqa: E402  (the same synthetic MNIST-shaped IDX writer)


def run(lathectl, db, args):
    # The launcher splits the cores between ranks; one process given the same cores says so itself.
    threads = [] if ("--nproc" in args or "--threads" in args) else ["--threads", "1"]
    cmd = [lathectl, "train", "--db", db, "--json", "-q", "--seed", "7"] + threads + args
    # Wall time of the whole process: start-up, training, the spans' hand-off and the store's
    # flush before exit. Reading the metrics back below is not timed.
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall_s = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit("bench_training_features: %s failed (%d): %s" % (" ".join(cmd), p.returncode, p.stderr.strip()))
    out = json.loads(p.stdout)
    # Per-epoch series: drop the first epoch (it also allocates gradients and optimizer state).
    series = {}
    for key in ("perf/step_ms", "perf/activation_mb", "perf/samples_per_s"):
        m = subprocess.run([lathectl, "metrics", str(out["run_id"]), "--key", key, "--json", "--db", db],
                           capture_output=True, text=True)
        if m.returncode != 0:
            raise SystemExit("bench_training_features: reading %s failed: %s" % (key, m.stderr.strip()))
        values = [pt["value"] for pt in json.loads(m.stdout)["metrics"][key]]
        series[key] = values[1:] if len(values) > 1 else values
    result = {k: statistics.median(v) for k, v in series.items()}
    result["wall_s"] = wall_s
    result["steps"] = out.get("steps", 0)
    return result


def compare(lathectl, db, variants, repeats):
    results = {name: [] for name, _ in variants}
    for rep in range(repeats):
        order = variants if rep % 2 == 0 else list(reversed(variants))
        for name, args in order:
            results[name].append(run(lathectl, db, args))
            r = results[name][-1]
            print("  rep %d %-14s wall %8.3f s  step %8.3f ms  activation %8.2f MB  %9.0f samples/s" % (
                rep + 1, name, r["wall_s"], r["perf/step_ms"], r["perf/activation_mb"], r["perf/samples_per_s"]),
                flush=True)
    return {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in results.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lathectl", required=True)
    ap.add_argument("--out", default=None, help="directory for bench_training_features.json")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="fewer epochs and repeats (for CTest)")
    a = ap.parse_args()
    if not os.access(a.lathectl, os.X_OK):
        print("bench_training_features: %s is not executable" % a.lathectl, file=sys.stderr)
        return 2
    repeats = 2 if a.quick else a.repeats
    with tempfile.TemporaryDirectory(prefix="lathe-bench-features-") as tmp:
        db = os.path.join(tmp, "bench.db")
        hidden = ",".join(["1024"] * 16)
        epochs = "3" if a.quick else "4"
        print("activation checkpointing: MLP 64-%s-10 (16 x 1024), batch 256, digits, fp32, %s epochs" % ("1024-" * 15 + "1024", epochs))
        deep = ["--hidden", hidden, "--batch", "256", "--epochs", epochs, "--checkpoint-every", "0"]
        ck = compare(a.lathectl, db, [("baseline", deep), ("checkpointing", deep + ["--activation-checkpointing"])],
                     repeats)

        idx = os.path.join(tmp, "idx")
        write_idx(idx, 4096, 256, 1)
        mnist = ["--data", "idx:" + idx, "--hidden", "512,512", "--batch", "128",
                 "--epochs", "3" if a.quick else "4", "--checkpoint-every", "0"]
        print("profiler overhead: MLP 784-512-512-10, batch 128, synthetic 28x28 IDX (4,096 images)")
        prof = compare(a.lathectl, db, [
            ("baseline", mnist),
            ("profiler off", mnist + ["--profile", "--profile-wait", "100000000"]),
            ("profiler on", mnist + ["--profile", "--profile-wait", "0", "--profile-warmup", "0",
                                      "--profile-active", "1", "--profile-repeat", "0"]),
        ], repeats)

        print("data parallel: MLP 784-512-512-10, global batch 256: 1 process vs 2 ranks x 128")
        dp = compare(a.lathectl, db, [
            ("1 process", mnist[:mnist.index("--batch")] + ["--batch", "256", "--threads", "2"] +
             mnist[mnist.index("--batch") + 2:]),
            ("2 ranks", mnist[:mnist.index("--batch")] + ["--batch", "128", "--nproc", "2"] + mnist[mnist.index("--batch") + 2:]),
        ], repeats)

    base, chk = ck["baseline"], ck["checkpointing"]
    mem_saving = 1.0 - chk["perf/activation_mb"] / base["perf/activation_mb"]
    time_cost = chk["perf/step_ms"] / base["perf/step_ms"] - 1.0
    pb, poff, pon = prof["baseline"], prof["profiler off"], prof["profiler on"]
    # The headline: whole-run wall time (medians of alternated runs), with and without the profiler.
    off = poff["wall_s"] / pb["wall_s"] - 1.0
    on = pon["wall_s"] / pb["wall_s"] - 1.0
    # The same difference per step, against the baseline's step time: start-up and validation,
    # which the profiler does not touch, no longer dilute it.
    steps = pb["steps"] or 1
    off_ms_per_step = 1000.0 * (poff["wall_s"] - pb["wall_s"]) / steps
    on_ms_per_step = 1000.0 * (pon["wall_s"] - pb["wall_s"]) / steps
    off_step_share = off_ms_per_step / pb["perf/step_ms"]
    on_step_share = on_ms_per_step / pb["perf/step_ms"]
    # Context only: the trainer's own step timer.
    off_timer = poff["perf/step_ms"] / pb["perf/step_ms"] - 1.0
    on_timer = pon["perf/step_ms"] / pb["perf/step_ms"] - 1.0
    print("-" * 78)
    print("%-34s %12s %12s %12s" % ("medians", "step ms", "activation MB", "run wall s"))
    for name, r in list(ck.items()):
        print("%-34s %12.3f %12.2f %12.3f" % ("deep MLP, " + name, r["perf/step_ms"], r["perf/activation_mb"],
                                              r["wall_s"]))
    for name, r in prof.items():
        print("%-34s %12.3f %12s %12.3f" % ("784-512-512, " + name, r["perf/step_ms"], "", r["wall_s"]))
    for name, r in dp.items():
        print("%-34s %12.3f %12s %10.0f samples/s" % ("global batch 256, " + name, r["perf/step_ms"], "", r["perf/samples_per_s"]))
    print("-" * 78)
    print("data parallel: 2 ranks / 1 process samples/s: %.2fx" % (dp["2 ranks"]["perf/samples_per_s"] / dp["1 process"]["perf/samples_per_s"]))
    print("activation checkpointing: %5.1f%% less activation memory for %+5.1f%% step time  (target >= 40%% for <= 35%%)"
          % (100 * mem_saving, 100 * time_cost))
    print("profiler, whole lathectl train run (wall time, %d steps, start-up and store flush included):" % steps)
    print("  off: %+5.1f%% (target < 1%%)   on: %+5.1f%% (target < 10%%)" % (100 * off, 100 * on))
    print("  per step: off %+.3f ms (%+5.1f%% of the baseline's %.3f ms step), on %+.3f ms (%+5.1f%%)"
          % (off_ms_per_step, 100 * off_step_share, pb["perf/step_ms"], on_ms_per_step, 100 * on_step_share))
    print("  context, perf/step_ms (the trainer's step timer): off %+5.1f%%, on %+5.1f%%"
          % (100 * off_timer, 100 * on_timer))
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "bench_training_features.json"), "w") as f:
            json.dump({"checkpointing": ck, "profiler": prof, "data_parallel": dp, "activation_memory_saving": mem_saving,
                       "checkpointing_step_time_cost": time_cost,
                       "profiler_off_wall_cost": off, "profiler_on_wall_cost": on,
                       "profiler_off_ms_per_step": off_ms_per_step, "profiler_on_ms_per_step": on_ms_per_step,
                       "profiler_off_step_share": off_step_share, "profiler_on_step_share": on_step_share,
                       "profiler_off_step_timer_cost": off_timer, "profiler_on_step_timer_cost": on_timer,
                       "repeats": repeats}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
