#!/usr/bin/python3
"""bench_compress: what each compression method costs and gains on digits, parent vs compressed.

Every figure comes from `lathectl compress ... --json`, whose report measures the parent and the
compressed version side by side in one process (accuracy on the same validation split, latency at
batch 1 and 32 alternated between the two), plus, for distillation, the same student trained
alone on the same split and seed:

  quantize   the digits MLP (64-128-128-10, 20 epochs): dynamic, static (histogram) and qat int8.
             Targets: within 1, 1.5 and 0.5 accuracy points of the fp32 parent.
  prune      the digits CNN (15 epochs), 50% of its channels and head neurons in rounds of 25%,
             3 fine-tuning epochs each. Targets: within 1.5 points, >= 1.6x faster at batch 32.
  distill    per seed (3 seeds): a teacher CNN of 32 and 64 channels and a 128-unit head (53,002
             parameters, 30 epochs), the student CNN of 16 and 48 channels and a 96-unit head
             (26,618 parameters, 20 epochs) trained alone and distilled (T = 4, alpha = 0.7), one
             thread each. Targets: the distilled mean within 2 points of the teachers' mean and
             above the alone mean.

Exit codes: 0 measured (whatever the figures), 1 something broke, 2 bad arguments.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def lathectl(binary, db, args):
    cmd = [binary] + args + ["--db", db, "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("bench_compress: %s failed (%d): %s" % (" ".join(cmd), p.returncode, p.stderr.strip()))
    return json.loads(p.stdout)


def train(binary, db, args):
    out = lathectl(binary, db, ["train", "-q", "--threads", "1"] + args)
    return out["run_id"], out["val/accuracy"]


def register(binary, db, name, run_id):
    lathectl(binary, db, ["models", "register", name, "--run", str(run_id)])


def report_row(label, r):
    b32 = r["parent_latency_ms_b32"] / r["latency_ms_b32"] if r["latency_ms_b32"] > 0 else 0
    b1 = r["parent_latency_ms_b1"] / r["latency_ms_b1"] if r["latency_ms_b1"] > 0 else 0
    print("  %-18s accuracy %6.2f%% -> %6.2f%% (%+5.2f pt)  size %.2fx smaller  speed b1 %.2fx  b32 %.2fx"
          % (label, 100 * r["parent_accuracy"], 100 * r["accuracy"], 100 * (r["accuracy"] - r["parent_accuracy"]),
             r["parent_size_bytes"] / max(1, r["size_bytes"]), b1, b32))
    return {"accuracy": r["accuracy"], "parent_accuracy": r["parent_accuracy"], "speedup_b1": b1,
            "speedup_b32": b32, "size_ratio": r["parent_size_bytes"] / max(1, r["size_bytes"])}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lathectl", required=True)
    ap.add_argument("--out", default="")
    ap.add_argument("--quick", action="store_true", help="one distillation seed instead of three")
    a = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        db = os.path.join(tmp, "ws.db")
        print("quantize (digits MLP):")
        run_id, _ = train(a.lathectl, db, ["--model", "mlp", "--epochs", "20", "--seed", "5"])
        register(a.lathectl, db, "digits", run_id)
        for mode in ("dynamic", "static", "qat"):
            r = lathectl(a.lathectl, db, ["compress", "quantize", "digits:1", "--mode", mode])
            results["quantize_" + mode] = report_row(mode, r)

        print("prune (digits CNN, 50%, rounds of 25%):")
        run_id, _ = train(a.lathectl, db, ["--model", "cnn", "--epochs", "15", "--seed", "3"])
        register(a.lathectl, db, "cnn", run_id)
        r = lathectl(a.lathectl, db, ["compress", "prune", "cnn:1", "--target-sparsity", "0.5"])
        results["prune"] = report_row("l1, 3 rounds", r)
        results["prune"]["parameters"] = [r["parent_parameters"], r["parameters"]]

        print("distill (teacher CNN 32,64:128 -> student CNN 16,48:96):")
        seeds = [1] if a.quick else [1, 2, 3]
        rows = []
        for seed in seeds:
            s = str(seed)
            run_id, teacher = train(a.lathectl, db, ["--model", "cnn", "--channels", "32,64", "--head", "128",
                                                     "--epochs", "30", "--seed", s])
            register(a.lathectl, db, "teacher" + s, run_id)
            _, alone = train(a.lathectl, db, ["--model", "cnn", "--channels", "16,48", "--head", "96",
                                              "--epochs", "20", "--seed", s])
            r = lathectl(a.lathectl, db, ["compress", "distill", "--teacher", "teacher%s:1" % s, "--student",
                                          "cnn:16,48:96", "--name", "student" + s, "--epochs", "20", "--threads", "1"])
            rows.append((teacher, alone, r["accuracy"], r["parameters"], r["parent_parameters"]))
            print("  seed %d: teacher %.2f%% (%d parameters), student alone %.2f%%, distilled %.2f%% (%d parameters)"
                  % (seed, 100 * teacher, r["parent_parameters"], 100 * alone, 100 * r["accuracy"], r["parameters"]))
        t = statistics.mean(x[0] for x in rows)
        al = statistics.mean(x[1] for x in rows)
        d = statistics.mean(x[2] for x in rows)
        print("  mean of %d: teacher %.2f%%, alone %.2f%%, distilled %.2f%%: distilled - teacher %+.2f pt, "
              "distilled - alone %+.2f pt" % (len(rows), 100 * t, 100 * al, 100 * d, 100 * (d - t), 100 * (d - al)))
        results["distill"] = {"seeds": seeds, "teacher": t, "alone": al, "distilled": d,
                              "rows": [list(x) for x in rows]}
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "bench_compress.json"), "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
