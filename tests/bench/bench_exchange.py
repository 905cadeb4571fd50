#!/usr/bin/python3
"""bench_exchange: the gradient exchange as `lathectl train` records it, for the figures the distributed README quotes.

Every figure comes from the comm/* metrics that rank 0 of a real `lathectl train --nproc N` run
records per step (comm/bytes_sent: the bytes the reducer accounts as sent by rank 0 in that
step, from the sizes of the messages it hands to the process group; comm/overlap: the share of
the exchange that ran while backward was still running; comm/compression_ratio: fp32 ring
all-reduce bytes of the same gradients / bytes sent). bench_allreduce checks those accounted
bytes against the bytes a process actually writes to its sockets.

  overlap     MLP 64-1024-1024-1024-10 on digits, batch 64 per rank, 1 MB buckets, 2 ranks:
              comm/overlap for the fp32 ring, int8 (ring, error feedback), ps (fp32) and
              hierarchical with one rank per host (fp32). Median over a run's steps (the first
              step, which allocates the buckets, dropped), then median over alternated repeats.
  ps bytes    the default MLP (64-128-128-10) on digits, 4 ranks, --strategy ps: bytes rank 0
              (the server) sends per step with int4 + error feedback against uncompressed.
  sparse rows --model embed, a 16384 x 128 table (--hidden 128,128), 2 ranks x batch 32,
              --strategy ps: bytes rank 0 sends per step against the fp32 ring all-reduce of the
              same gradients (bytes_sent x compression_ratio); in the full form (20 epochs) also
              the validation accuracy against one process with batch 64 (the same global batch).

Exit codes: 0 measured (whatever the figures), 1 something broke, 2 bad arguments.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def train(lathectl, db, args):
    cmd = [lathectl, "train", "--db", db, "--json", "-q", "--seed", "7", "--checkpoint-every", "0"] + args
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("bench_exchange: %s failed (%d): %s" % (" ".join(cmd), p.returncode, p.stderr.strip()))
    return json.loads(p.stdout)


def series(lathectl, db, run_id, key):
    m = subprocess.run([lathectl, "metrics", str(run_id), "--key", key, "--json", "--db", db],
                       capture_output=True, text=True)
    if m.returncode != 0:
        raise SystemExit("bench_exchange: reading %s of run %s failed: %s" % (key, run_id, m.stderr.strip()))
    values = [pt["value"] for pt in json.loads(m.stdout)["metrics"][key]]
    values = [float(v) for v in values if isinstance(v, (int, float))]
    if not values:
        raise SystemExit("bench_exchange: run %s recorded no %s" % (run_id, key))
    return values


def steady(values):
    """Drop the first step (it allocates the buckets), when there is more than one."""
    return values[1:] if len(values) > 1 else values


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lathectl", required=True)
    ap.add_argument("--out", default=None, help="directory for bench_exchange.json")
    ap.add_argument("--repeats", type=int, default=3, help="alternated repeats of the overlap runs")
    ap.add_argument("--quick", action="store_true", help="1 epoch per run, 1 repeat, no accuracy comparison")
    a = ap.parse_args()
    if not os.access(a.lathectl, os.X_OK):
        print("bench_exchange: %s is not executable" % a.lathectl, file=sys.stderr)
        return 2
    repeats = 1 if a.quick else max(1, a.repeats)
    result = {"repeats": repeats, "quick": a.quick}
    with tempfile.TemporaryDirectory(prefix="lathe-bench-exchange-") as tmp:
        db = os.path.join(tmp, "bench.db")

        # ---- overlap --------------------------------------------------------------------------
        epochs = "1" if a.quick else "3"
        common = ["--nproc", "2", "--batch", "64", "--hidden", "1024,1024,1024", "--bucket-mb", "1",
                  "--epochs", epochs]
        modes = [("ring fp32", []),
                 ("ring int8", ["--compress", "int8", "--error-feedback", "on"]),
                 ("ps fp32", ["--strategy", "ps"]),
                 ("hierarchical fp32", ["--strategy", "hierarchical", "--ranks-per-host", "1"])]
        print("overlap: MLP 64-1024-1024-1024-10, digits, batch 64 per rank, 1 MB buckets, 2 ranks, %s epoch(s)" % epochs)
        per_mode = {name: [] for name, _ in modes}
        for rep in range(repeats):
            order = modes if rep % 2 == 0 else list(reversed(modes))
            for name, extra in order:
                out = train(a.lathectl, db, common + extra)
                overlap = statistics.median(steady(series(a.lathectl, db, out["run_id"], "comm/overlap")))
                per_mode[name].append(overlap)
                print("  rep %d %-18s comm/overlap median %5.1f%% over %d steps" % (
                    rep + 1, name, 100 * overlap, out.get("steps", 0)), flush=True)
        overlap = {name: statistics.median(v) for name, v in per_mode.items()}
        result["overlap"] = overlap

        # ---- ps bytes, 4 ranks ----------------------------------------------------------------
        print("ps bytes: MLP 64-128-128-10 (26,122 parameters), digits, 4 ranks, --strategy ps, 1 epoch")
        ps = {}
        for name, extra in (("none", ["--compress", "none"]),
                            ("int4", ["--compress", "int4", "--error-feedback", "on"])):
            out = train(a.lathectl, db, ["--nproc", "4", "--strategy", "ps", "--epochs", "1"] + extra)
            sent = statistics.median(series(a.lathectl, db, out["run_id"], "comm/bytes_sent"))
            ps[name] = sent
            print("  %-5s rank 0 sends %10.0f bytes per step (median)" % (name, sent), flush=True)
        result["ps_4_ranks"] = {"rank0_bytes_per_step_none": ps["none"], "rank0_bytes_per_step_int4": ps["int4"],
                                "ratio": ps["none"] / ps["int4"]}

        # ---- sparse rows ----------------------------------------------------------------------
        sparse_epochs = "1" if a.quick else "20"
        model = ["--model", "embed", "--embedding-rows", "16384", "--hidden", "128,128", "--epochs", sparse_epochs]
        print("sparse rows: embed 16384 x 128 (--hidden 128,128), digits, 2 ranks x batch 32, --strategy ps, "
              "%s epoch(s)" % sparse_epochs)
        out = train(a.lathectl, db, model + ["--nproc", "2", "--batch", "32", "--strategy", "ps"])
        sent = series(a.lathectl, db, out["run_id"], "comm/bytes_sent")
        ratio = series(a.lathectl, db, out["run_id"], "comm/compression_ratio")
        ring = [s * r for s, r in zip(sent, ratio)]
        sparse = {"rank0_bytes_per_step": statistics.median(sent), "fp32_ring_bytes_per_step": statistics.median(ring),
                  "ratio": statistics.median(ratio), "val_accuracy_2_ranks": out.get("val/accuracy")}
        if not a.quick:
            one = train(a.lathectl, db, model + ["--batch", "64"])
            sparse["val_accuracy_1_process"] = one.get("val/accuracy")
        result["sparse_ps"] = sparse

    print("-" * 78)
    print("comm/overlap (share of the exchange hidden under backward), median of %d run(s):" % repeats)
    for name, v in overlap.items():
        print("  %-18s %5.1f%%" % (name, 100 * v))
    print("ps, 4 ranks, rank 0 (the server) per step: %.1f KB with int4 + error feedback, %.1f KB uncompressed "
          "(%.2fx fewer)" % (ps["int4"] / 1e3, ps["none"] / 1e3, ps["none"] / ps["int4"]))
    acc = ""
    if sparse.get("val_accuracy_1_process") is not None and sparse.get("val_accuracy_2_ranks") is not None:
        acc = "; val/accuracy %.1f%% (2 ranks) vs %.1f%% (1 process)" % (
            100 * sparse["val_accuracy_2_ranks"], 100 * sparse["val_accuracy_1_process"])
    print("sparse rows in ps, 2 ranks, rank 0 per step: %.1f KB against %.2f MB for the fp32 ring (%.1fx fewer)%s"
          % (sparse["rank0_bytes_per_step"] / 1e3, sparse["fp32_ring_bytes_per_step"] / 1e6, sparse["ratio"], acc))
    print("(bytes: what the reducer accounts as sent, comm/bytes_sent; KB = 1000 bytes)")
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "bench_exchange.json"), "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
