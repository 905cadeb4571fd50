#!/usr/bin/python3
"""bench_startup: how long lathectl's workspace commands take with LibTorch loaded on demand.

LibTorch lives in liblathe_torch.so, which liblathe_core opens only when a command needs it
(core/src/torch_backend.h). The baseline is the same binary with LATHE_EAGER_TORCH=1, which loads
it at start-up as every command did before the split. Both are timed alternately, in one script,
on a workspace of --runs runs (recorded through `lathectl ingest` from one real worker stream),
and the table ends with the ratio of medians. Target: each command under 50 ms on 1,000 runs.

--check-only skips the timing: it verifies with the dynamic loader's own trace (LD_DEBUG=libs)
that `lathectl runs list` does not load libtorch while the eager baseline and `lathectl train`
do (so the check can fail), and exits 1 if not. CTest runs it as startup.torch_free.

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

COMMANDS = [
    ["--version"],
    ["runs", "list"],
    ["runs", "show", "1"],
    ["metrics", "1"],
    ["models", "list"],
    ["deployments"],
]


def env_with(eager, extra=None):
    env = dict(os.environ)
    env["LATHE_EAGER_TORCH"] = "1" if eager else "0"
    env.update(extra or {})
    return env


def run(cmd, env=None, check=True, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, **kw)
    if check and p.returncode != 0:
        raise SystemExit("bench_startup: %s failed (%d): %s" % (" ".join(cmd), p.returncode, p.stderr.strip()[-2000:]))
    return p


def loads_torch(cmd, eager):
    """Whether the dynamic loader opened libtorch while running cmd (from its LD_DEBUG trace)."""
    p = run(cmd, env=env_with(eager, {"LD_DEBUG": "libs"}))
    return "libtorch_cpu.so" in p.stderr or "libtorch.so" in p.stderr


def make_workspace(lathectl, db, runs):
    stream = run([lathectl, "worker", "--epochs", "1", "--threads", "1"]).stdout
    t0 = time.perf_counter()
    for i in range(runs):
        run([lathectl, "ingest", "-", "--db", db], input=stream)
    return time.perf_counter() - t0


def time_ms(cmd, eager):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env_with(eager))
    ms = (time.perf_counter() - t0) * 1000.0
    if p.returncode != 0:
        raise SystemExit("bench_startup: %s failed (%d): %s" % (" ".join(cmd), p.returncode, p.stderr.decode()[-2000:]))
    return ms


def check(lathectl, db):
    problems = []
    if loads_torch([lathectl, "runs", "list", "--db", db], eager=False):
        problems.append("`lathectl runs list` loaded libtorch")
    if not loads_torch([lathectl, "runs", "list", "--db", db], eager=True):
        problems.append("LATHE_EAGER_TORCH=1 did not load libtorch (the check cannot tell the two apart)")
    if not loads_torch([lathectl, "train", "--db", db, "--epochs", "1", "-q", "--threads", "1"], eager=False):
        problems.append("`lathectl train` ran without loading libtorch?")
    for p in problems:
        print("FAIL:", p)
    if not problems:
        print("startup: runs list does not load libtorch; the eager baseline and train do")
    return not problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lathectl", required=True)
    ap.add_argument("--out", help="directory for bench_startup.json")
    ap.add_argument("--runs", type=int, default=1000, help="runs in the workspace (default 1000)")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="7 repeats")
    ap.add_argument("--check-only", action="store_true", help="only verify that LibTorch is loaded on demand")
    a = ap.parse_args()
    repeats = 7 if a.quick else a.repeats

    with tempfile.TemporaryDirectory(prefix="bench_startup.") as tmp:
        db = os.path.join(tmp, "ws.db")
        if a.check_only:
            make_workspace(a.lathectl, db, 1)
            return 0 if check(a.lathectl, db) else 1
        ingest_s = make_workspace(a.lathectl, db, a.runs)
        if not check(a.lathectl, db):
            return 1
        print("workspace: %d runs recorded by `lathectl ingest` in %.1f s (%.1f ms each)"
              % (a.runs, ingest_s, ingest_s * 1000.0 / a.runs))
        rows = []
        for args in COMMANDS:
            cmd = [a.lathectl] + args + ([] if args == ["--version"] else ["--db", db])
            lazy, eager = [], []
            for rep in range(repeats):
                order = [(False, lazy), (True, eager)] if rep % 2 == 0 else [(True, eager), (False, lazy)]
                for flag, sink in order:
                    sink.append(time_ms(cmd, flag))
            rows.append({"command": "lathectl " + " ".join(args), "lazy_ms": statistics.median(lazy),
                         "eager_ms": statistics.median(eager), "lazy_min_ms": min(lazy), "lazy_max_ms": max(lazy)})
        print()
        print("%-28s %12s %18s %10s" % ("command (%d runs)" % a.runs, "on demand", "eager (baseline)", "speed-up"))
        for r in rows:
            print("%-28s %9.1f ms %15.1f ms %9.1fx" % (r["command"], r["lazy_ms"], r["eager_ms"], r["eager_ms"] / r["lazy_ms"]))
        worst = max(r["lazy_ms"] for r in rows)
        print("\nmedians of %d alternated repeats; slowest command on demand: %.1f ms (target < 50 ms: %s)"
              % (repeats, worst, "met" if worst < 50 else "NOT met"))
        if a.out:
            os.makedirs(a.out, exist_ok=True)
            with open(os.path.join(a.out, "bench_startup.json"), "w") as f:
                json.dump({"runs": a.runs, "repeats": repeats, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
