#!/usr/bin/python3
"""bench_tuning: Lathe's tuner (`lathectl tune`) against Optuna's TPE driving the same runs.

Every method searches the same space of the same base run configuration for the best
val/accuracy (direction max) with the same budget: N trials, P at a time, per study seed. Every
trial is an ordinary `lathectl train` run of the base configuration with the trial's values as
flags, in a fresh workspace per study:

  random     lathectl tune --algo random
  tpe        lathectl tune --algo tpe
  asha       lathectl tune --algo asha                 (random sampler, ASHA pruner)
  tpe+asha   lathectl tune --algo tpe --pruner asha
  ppo        lathectl tune --algo ppo
  optuna     optuna.create_study(direction="maximize", sampler=TPESampler(seed=S)),
             study.optimize(objective, n_trials=N, n_jobs=P), the objective running
             `lathectl train CONFIG --db WS --json -q --KEY VALUE ...` and returning its
             val/accuracy (Optuna's defaults otherwise: 10 random start-up trials, 24
             candidates, univariate, no pruner). Floats are suggested with log=True for
             loguniform, choices with suggest_categorical on their spec text ("[128,64]" is
             passed as --hidden 128,64).

ASHA (asha, tpe+asha): --budget-key epochs --min-budget 1 --eta 3, the base configuration's
epochs being the full budget; a pruned trial counts as one of the N. The study seed S is
`lathectl tune --study-seed S` and Optuna's TPESampler(seed=S); the runs' own seed is the base
configuration's default on both sides.

Problems:
  digits   the 64-...-10 MLP on the built-in digits (1,797 8x8 images, 20% held out), SGD,
           81 epochs (ASHA from epoch 3); space lr=loguniform(1e-4,1), batch=choice(16,32,64,128),
           hidden=choice([32],[64],[128,64]), momentum=uniform(0,0.99). Target 0.98.
  spirals  an MLP on synthetic:spirals (3 interleaved arms of 500 points, angular noise
           sigma 0.1 rad; the generator has no noise key) with only 15% of the points for
           training (val_split 0.85: 225 training points, 1,275 validation points), SGD,
           20 epochs; space lr=loguniform(1e-4,1), batch=choice(16,32,64,128),
           hidden=choice([16],[64],[128,128],[64,64,64]), momentum=uniform(0,0.99),
           weight_decay=loguniform(1e-6,0.01). Target 0.95. (With all 1,200 training points
           most reasonable settings reach 0.99 and every method ties at the ceiling.)
Both base configurations set threads = 1 (P trials share the cores).

Per method and problem, over the study seeds: the best val/accuracy of the study's complete
trials (mean and standard deviation), the mean wall time of the study (the whole `lathectl
tune` process; for Optuna, create_study + optimize), and the time to reach the target: the end
time of the first complete trial whose value makes the best-so-far reach the target, relative
to the earliest trial start (Lathe: the trials' started_at / ended_at; Optuna: recorded around
each subprocess). A study that never reaches the target counts its whole trial span (earliest
start to last end) and is reported as not reached ("k/S reached"). Ratios: Lathe TPE's best
against Optuna TPE's (difference, and whether |diff| < the pooled standard deviation
sqrt((s1^2 + s2^2) / 2), i.e. within seed-to-seed noise), and the mean time to target of
TPE+ASHA over that of random.

Full form: both problems, N = 30, 5 seeds, P = 2, every method. --quick (CTest): digits only,
epochs 4, N = 8, 2 seeds, P = 2, random, tpe+asha and optuna; it checks only that every study
ran N trials, all in a final state (complete, pruned or failed), with well-formed records and at
least one complete trial, never a speed or accuracy threshold.

Exit codes: 0 = measured (whatever the figures), 1 = something broke, 2 = bad arguments,
77 = skipped (/usr/bin/python3 has no optuna: apt install python3-optuna).
"""
import argparse
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

SKIP = 77
FINAL_STATES = ("complete", "pruned", "failed")

PROBLEMS = {
    "digits": {
        # 81 epochs: training, not the ~1 s start of a trial process, is most of a full trial, so
        # stopping one early saves time (ASHA's rungs at epochs 3, 9 and 27).
        "base": {"model": "mlp", "data": "digits", "epochs": 81, "optimizer": "sgd", "threads": 1},
        "min_budget": 3,
        "space": ["lr=loguniform(1e-4,1)", "batch=choice(16,32,64,128)", "hidden=choice([32],[64],[128,64])",
                  "momentum=uniform(0,0.99)"],
        "target": 0.98,
    },
    "spirals": {
        "base": {"model": "mlp", "data": "synthetic:spirals", "epochs": 20, "optimizer": "sgd", "threads": 1,
                 "val_split": 0.85},
        "space": ["lr=loguniform(1e-4,1)", "batch=choice(16,32,64,128)",
                  "hidden=choice([16],[64],[128,128],[64,64,64])", "momentum=uniform(0,0.99)",
                  "weight_decay=loguniform(1e-6,0.01)"],
        "target": 0.95,
    },
}

ASHA_ARGS = ["--budget-key", "epochs", "--min-budget", "MIN_BUDGET", "--eta", "3"]
METHODS = {
    "random": ["--algo", "random"],
    "tpe": ["--algo", "tpe"],
    "asha": ["--algo", "asha"] + ASHA_ARGS,
    "tpe+asha": ["--algo", "tpe", "--pruner", "asha"] + ASHA_ARGS,
    "ppo": ["--algo", "ppo"],
    "optuna": None,  # Optuna's TPESampler, in this process
}
LABELS = {"random": "Lathe random", "tpe": "Lathe TPE", "asha": "Lathe ASHA (random)",
          "tpe+asha": "Lathe TPE+ASHA", "ppo": "Lathe PPO", "optuna": "Optuna TPE"}


class Broken(Exception):
    """Something that should work did not: exit 1."""


# ---------------------------------------------------------------------------------------------
# The search space, parsed once for both sides (Lathe gets the text as is).

def split_top(text):
    """Splits on commas outside brackets."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def parse_space(text):
    m = re.fullmatch(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(uniform|loguniform|int|logint|choice)\s*\((.*)\)\s*", text)
    if not m:
        raise ValueError("bad space entry: " + text)
    key, kind, args = m.group(1), m.group(2), split_top(m.group(3))
    if kind == "choice":
        choices = [a[1:-1].strip() if a.startswith("[") and a.endswith("]") else a for a in args]
        return {"key": key, "kind": kind, "choices": [",".join(x.strip() for x in c.split(",")) for c in choices]}
    if len(args) != 2:
        raise ValueError("bad bounds: " + text)
    lo, hi = float(args[0]), float(args[1])
    return {"key": key, "kind": kind, "lo": lo, "hi": hi}


def suggest(trial, p):
    k = p["kind"]
    if k == "choice":
        return trial.suggest_categorical(p["key"], p["choices"])
    if k in ("uniform", "loguniform"):
        return repr(trial.suggest_float(p["key"], p["lo"], p["hi"], log=(k == "loguniform")))
    return str(trial.suggest_int(p["key"], int(p["lo"]), int(p["hi"]), log=(k == "logint")))


def toml_value(v):
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    return repr(v)


def write_config(path, base):
    with open(path, "w") as f:
        for k, v in base.items():
            f.write("%s = %s\n" % (k, toml_value(v)))


# ---------------------------------------------------------------------------------------------
# The two sides.

def last_json_object(text):
    text = text.strip()
    try:
        return json.loads(text)
    except ValueError:
        pass
    dec = json.JSONDecoder()
    starts = [m.start() for m in re.finditer(r"(?m)^\{", text)]
    for s in reversed(starts):
        try:
            obj, _ = dec.raw_decode(text[s:])
            return obj
        except ValueError:
            continue
    raise Broken("no JSON object in the output: " + text[-500:])


def run_lathe(a, method, problem, config, space, seed, workdir):
    db = os.path.join(workdir, "ws.db")
    name = "bench-%s-%s-s%d" % (re.sub(r"[^A-Za-z0-9]", "-", method), problem, seed)
    cmd = [a.lathectl, "tune", config]
    for s in space:
        cmd += ["--space", s]
    cmd += ["--objective", "val/accuracy", "--direction", "max", "--trials", str(a.trials),
            "--parallel", str(a.parallel)] + [
            ("%g" % (a.min_budget or PROBLEMS[problem].get("min_budget", 1)) if x == "MIN_BUDGET" else x)
            for x in METHODS[method]] + [
            "--study", name, "--study-seed", str(seed), "--db", db, "--json", "-q"]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.study_timeout)
    wall = time.time() - t0
    if p.returncode != 0:
        raise Broken("%s failed (%d):\n%s\n%s" % (" ".join(cmd), p.returncode, p.stdout[-2000:], p.stderr[-4000:]))
    study = last_json_object(p.stdout)
    trials = []
    for t in study.get("trials", []):
        trials.append({"number": t.get("number"), "run_id": t.get("run_id"), "state": t.get("state"),
                       "params": t.get("params"), "value": t.get("value"), "pruned_at": t.get("pruned_at"),
                       "started_at": t.get("started_at"), "ended_at": t.get("ended_at"), "error": t.get("error")})
    extra = {"study": name, "sampler": study.get("sampler"), "pruner": study.get("pruner"),
             "status": study.get("status"), "best_value": study.get("best_value"),
             "best_trial": study.get("best_trial"), "best_run_id": study.get("best_run_id"),
             "best_params": study.get("best_params"), "reported_seconds": study.get("seconds")}
    if a.check_show:
        q = subprocess.run([a.lathectl, "studies", "show", name, "--json", "--db", db], capture_output=True,
                           text=True, timeout=120)
        if q.returncode != 0:
            raise Broken("lathectl studies show %s failed (%d): %s" % (name, q.returncode, q.stderr[-2000:]))
        shown = last_json_object(q.stdout)
        if len(shown.get("trials", [])) != len(trials) or shown.get("best_value") != study.get("best_value"):
            raise Broken("studies show %s disagrees with tune --json: %d vs %d trials, best %r vs %r"
                         % (name, len(shown.get("trials", [])), len(trials), shown.get("best_value"),
                            study.get("best_value")))
    return trials, wall, extra


def run_optuna(a, problem, config, space, seed, workdir):
    import optuna
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # failed trials are counted, not logged
    db = os.path.join(workdir, "ws.db")
    params = [parse_space(s) for s in space]
    records, lock = [], threading.Lock()

    class TrialFailed(Exception):
        pass

    def objective(trial):
        values = {p["key"]: suggest(trial, p) for p in params}
        cmd = [a.lathectl, "train", config, "--db", db, "--json", "-q"]
        for k, v in values.items():
            cmd += ["--" + k.replace("_", "-"), v]  # run-spec key weight_decay is the flag --weight-decay
        start = time.time()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.study_timeout)
        end = time.time()
        rec = {"number": trial.number, "run_id": None, "state": "failed", "params": values, "value": None,
               "pruned_at": None, "started_at": start, "ended_at": end, "error": ""}
        try:
            out = json.loads(p.stdout) if p.returncode == 0 else None
        except ValueError:
            out = None
        if out is not None and out.get("status") == "completed" and isinstance(out.get("val/accuracy"), (int, float)):
            rec.update(run_id=out.get("run_id"), state="complete", value=float(out["val/accuracy"]))
        else:
            rec["error"] = ("exit %d: " % p.returncode) + (p.stderr.strip()[-500:] or p.stdout.strip()[-500:])
        with lock:
            records.append(rec)
        if rec["state"] != "complete":
            raise TrialFailed(rec["error"])
        return rec["value"]

    t0 = time.time()
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed),
                                study_name="bench-optuna-%s-s%d" % (problem, seed))
    study.optimize(objective, n_trials=a.trials, n_jobs=a.parallel, catch=(TrialFailed,))
    wall = time.time() - t0
    records.sort(key=lambda r: r["number"])
    states = {t.number: t.state.name for t in study.trials}
    for r in records:  # Optuna's own verdict must agree with ours
        want = "COMPLETE" if r["state"] == "complete" else "FAIL"
        if states.get(r["number"]) != want:
            raise Broken("optuna trial %d is %s, recorded %s" % (r["number"], states.get(r["number"]), r["state"]))
    extra = {"study": study.study_name, "sampler": "optuna.TPESampler", "pruner": "none", "status": "completed",
             "best_value": study.best_value if any(r["state"] == "complete" for r in records) else None,
             "best_params": study.best_params if any(r["state"] == "complete" for r in records) else None,
             "optuna_version": optuna.__version__}
    return records, wall, extra


# ---------------------------------------------------------------------------------------------
# Checks and figures.

def check_study(label, trials, extra, n):
    if len(trials) != n:
        raise Broken("%s: %d trials, expected %d" % (label, len(trials), n))
    numbers = sorted(t["number"] for t in trials if isinstance(t.get("number"), int))
    if numbers != list(range(n)):
        raise Broken("%s: trial numbers %r, expected 0..%d" % (label, numbers, n - 1))
    for t in trials:
        where = "%s trial %s" % (label, t.get("number"))
        if t.get("state") not in FINAL_STATES:
            raise Broken("%s: state %r is not final" % (where, t.get("state")))
        for k in ("started_at", "ended_at"):
            if not isinstance(t.get(k), (int, float)) or not t[k] > 1e9:
                raise Broken("%s: %s = %r is not a unix time" % (where, k, t.get(k)))
        if t["ended_at"] < t["started_at"]:
            raise Broken("%s: ended_at %r before started_at %r" % (where, t["ended_at"], t["started_at"]))
        if not isinstance(t.get("params"), dict) or not t["params"]:
            raise Broken("%s: params %r" % (where, t.get("params")))
        if t["state"] == "complete":
            v = t.get("value")
            if not isinstance(v, (int, float)) or not (0.0 <= v <= 1.0):
                raise Broken("%s: complete with value %r" % (where, v))
            if not isinstance(t.get("run_id"), int) or t["run_id"] <= 0:
                raise Broken("%s: complete with run_id %r" % (where, t.get("run_id")))
    complete = [t for t in trials if t["state"] == "complete"]
    if not complete:
        raise Broken("%s: no complete trial (%s)" % (label, "; ".join(
            str(t.get("error"))[:200] for t in trials[:3])))
    best = max(t["value"] for t in complete)
    # The study's own best: that of its complete trials (or, should the tuner count them, of
    # its complete and pruned trials), and the value of the trial it names.
    valued = complete + [t for t in trials if t["state"] == "pruned" and isinstance(t.get("value"), (int, float))]
    rb = extra.get("best_value")
    if rb is not None and min(abs(rb - best), abs(rb - max(t["value"] for t in valued))) > 1e-9:
        raise Broken("%s: reported best %r, best complete trial %r" % (label, rb, best))
    if rb is not None and isinstance(extra.get("best_trial"), int):
        named = [t for t in trials if t["number"] == extra["best_trial"]]
        if not named or named[0].get("value") is None or abs(named[0]["value"] - rb) > 1e-9:
            raise Broken("%s: best_trial %r does not have the best value %r" % (label, extra["best_trial"], rb))
    if extra.get("status") not in (None, "completed"):
        raise Broken("%s: study status %r" % (label, extra.get("status")))


def summarise(trials, target, best_after):
    """Best of the complete trials among the first `best_after` (by trial number), and when the
    best-so-far of all of them first reached the target."""
    t0 = min(t["started_at"] for t in trials)
    span = max(t["ended_at"] for t in trials) - t0
    done = sorted((t for t in trials if t["state"] == "complete"), key=lambda t: t["ended_at"])
    best = max([t["value"] for t in done if t["number"] < best_after] or [-math.inf])
    so_far, reached = -math.inf, None
    for t in done:
        so_far = max(so_far, t["value"])
        if reached is None and so_far >= target:
            reached = t["ended_at"] - t0
    counts = {s: sum(1 for t in trials if t["state"] == s) for s in FINAL_STATES}
    return {"best": best, "time_to_target": reached if reached is not None else span,
            "reached": reached is not None, "span": span, "counts": counts,
            "trial_seconds": sum(t["ended_at"] - t["started_at"] for t in trials)}


def compare_best(ours, theirs):
    """Difference of mean bests, the pooled standard deviation, and whether it is within noise."""
    diff = ours["best_mean"] - theirs["best_mean"]
    pooled = math.sqrt((ours["best_std"] ** 2 + theirs["best_std"] ** 2) / 2)
    within = abs(diff) < pooled or diff == 0
    verdict = "within noise" if within else ("Lathe better" if diff > 0 else "Optuna better") + " beyond noise"
    return diff, pooled, within, verdict


def mean_std(xs):
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lathectl", required=True)
    ap.add_argument("--out", default="")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--problems", default="", help="comma-separated: digits,spirals")
    ap.add_argument("--methods", default="", help="comma-separated: " + ",".join(METHODS))
    ap.add_argument("--trials", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=0, help="study seeds 0..S-1")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=0, help="override the base configurations' epochs")
    ap.add_argument("--min-budget", type=float, default=0,
                    help="ASHA's first rung in epochs (default: the problem's)")
    ap.add_argument("--best-after", type=int, default=0,
                    help="report the best of the first K trials (default: all); the time to target uses all")
    ap.add_argument("--target", action="append", default=[], metavar="PROBLEM=ACC",
                    help="override a problem's target accuracy, e.g. digits=0.98")
    ap.add_argument("--study-timeout", type=float, default=3600, help="seconds one study may take")
    ap.add_argument("--check-show", action="store_true",
                    help="also check `lathectl studies show NAME --json` against tune's --json (on with --quick)")
    a = ap.parse_args()

    problems = [p for p in (a.problems or ("digits" if a.quick else "digits,spirals")).split(",") if p]
    methods = [m for m in (a.methods or ("random,tpe+asha,optuna" if a.quick else ",".join(METHODS))).split(",") if m]
    for p in problems:
        if p not in PROBLEMS:
            ap.error("unknown problem %r" % p)
    for m in methods:
        if m not in METHODS:
            ap.error("unknown method %r (%s)" % (m, ", ".join(METHODS)))
    a.trials = a.trials or (8 if a.quick else 30)
    a.seeds = a.seeds or (2 if a.quick else 5)
    a.epochs = a.epochs or (4 if a.quick else 0)
    a.best_after = a.best_after or a.trials
    a.check_show = a.check_show or a.quick
    if a.trials < 1 or a.seeds < 1 or a.parallel < 1:
        ap.error("--trials, --seeds and --parallel must be >= 1")
    targets = {p: PROBLEMS[p]["target"] for p in PROBLEMS}
    for t in a.target:
        k, _, v = t.partition("=")
        if k not in PROBLEMS:
            ap.error("--target %s: unknown problem" % t)
        targets[k] = float(v)

    if "optuna" in methods:
        try:
            import optuna  # noqa: F401
        except ImportError as e:
            print("bench_tuning: SKIPPED: %s cannot import optuna (%s); install Debian's python3-optuna"
                  % (sys.executable, e))
            return SKIP
    if not os.access(a.lathectl, os.X_OK):
        print("bench_tuning: %s is not an executable" % a.lathectl)
        return 1
    if any(METHODS[m] is not None for m in methods):
        h = subprocess.run([a.lathectl, "tune", "--help"], capture_output=True, text=True)
        if h.returncode != 0:
            print("bench_tuning: `%s tune` is not available (%d): %s" % (a.lathectl, h.returncode, h.stderr.strip()))
            return 1

    print("bench_tuning: %s, %d cores, %s; %d trials x %d seeds, %d in parallel%s" %
          (platform.processor() or platform.machine(), os.cpu_count(), ", ".join(methods), a.trials, a.seeds,
           a.parallel, " (quick)" if a.quick else ""))
    tmp = tempfile.mkdtemp(prefix="lathe-bench-tuning-")
    studies, summary, ratios, bases = [], {}, {}, {}
    try:
        for problem in problems:
            base = dict(PROBLEMS[problem]["base"])
            if a.epochs:
                base["epochs"] = a.epochs
            space = PROBLEMS[problem]["space"]
            bases[problem] = base
            config = os.path.join(tmp, problem + ".toml")
            write_config(config, base)
            target = targets[problem]
            print("\n%s: %s; target val/accuracy >= %.3f" %
                  (problem, " ".join("%s=%s" % (k, toml_value(v)) for k, v in base.items()), target))
            print("  space: " + "  ".join(space))
            # Seeds outermost and methods alternated, so drift in the machine's load is shared.
            for seed in range(a.seeds):
                order = methods if seed % 2 == 0 else list(reversed(methods))
                for method in order:
                    workdir = os.path.join(tmp, "%s-%s-s%d" % (problem, method.replace("+", "-"), seed))
                    os.makedirs(workdir)
                    if METHODS[method] is None:
                        trials, wall, extra = run_optuna(a, problem, config, space, seed, workdir)
                    else:
                        trials, wall, extra = run_lathe(a, method, problem, config, space, seed, workdir)
                    label = "%s/%s/seed %d" % (problem, method, seed)
                    check_study(label, trials, extra, a.trials)
                    s = summarise(trials, target, a.best_after)
                    s.update(problem=problem, method=method, seed=seed, wall=wall, target=target,
                             extra=extra, trials=trials)
                    studies.append(s)
                    print("  seed %d %-20s best %.4f  wall %6.1f s  target %s  (%d complete, %d pruned, %d failed)" %
                          (seed, LABELS[method], s["best"], wall,
                           ("%.1f s" % s["time_to_target"]) if s["reached"] else "not reached",
                           s["counts"]["complete"], s["counts"]["pruned"], s["counts"]["failed"]))
                    shutil.rmtree(workdir, ignore_errors=True)

            summary[problem] = {}
            for method in methods:
                ss = [s for s in studies if s["problem"] == problem and s["method"] == method]
                bm, bs = mean_std([s["best"] for s in ss])
                wm, ws = mean_std([s["wall"] for s in ss])
                tm, ts = mean_std([s["time_to_target"] for s in ss])
                summary[problem][method] = {
                    "best_mean": bm, "best_std": bs, "best_min": min(s["best"] for s in ss),
                    "best_max": max(s["best"] for s in ss), "wall_mean": wm, "wall_std": ws,
                    "time_to_target_mean": tm, "time_to_target_std": ts,
                    "reached": sum(1 for s in ss if s["reached"]), "seeds": len(ss),
                    "pruned_mean": statistics.mean(s["counts"]["pruned"] for s in ss),
                    "failed_mean": statistics.mean(s["counts"]["failed"] for s in ss),
                    "trial_seconds_mean": statistics.mean(s["trial_seconds"] for s in ss)}

            print("\n%s, %d trials, %d seeds, %d in parallel; best = best val/accuracy of a complete trial among"
                  " the first %d; time to target %.3f from the first trial's start over all %d (not reached: the"
                  " whole trial span)" % (problem, a.trials, a.seeds, a.parallel, a.best_after, target, a.trials))
            print("  %-20s %18s %15s %12s %22s %9s %8s" %
                  ("method", "best mean ± std", "min..max", "study wall", "time to target", "reached",
                   "pruned"))
            for method in methods:
                m = summary[problem][method]
                print("  %-20s %9.4f ± %6.4f %7.4f..%6.4f %10.1f s %12.1f ± %5.1f s %5d/%-3d %8.1f" %
                      (LABELS[method], m["best_mean"], m["best_std"], m["best_min"], m["best_max"], m["wall_mean"],
                       m["time_to_target_mean"], m["time_to_target_std"], m["reached"], m["seeds"],
                       m["pruned_mean"]))
                if m["reached"] < m["seeds"]:
                    print("  %-20s   (time to target: %d of %d studies did not reach %.3f; their whole span counted)"
                          % ("", m["seeds"] - m["reached"], m["seeds"], target))

            r = {}
            sm = summary[problem]
            for ours, key in (("tpe", "tpe_vs_optuna"), ("tpe+asha", "tpe_asha_vs_optuna")):
                if ours not in sm or "optuna" not in sm:
                    continue
                diff, pooled, within, verdict = compare_best(sm[ours], sm["optuna"])
                r[key] = {"diff": diff, "pooled_std": pooled, "within_noise": within,
                          "wall_ratio": sm[ours]["wall_mean"] / sm["optuna"]["wall_mean"]}
                print("  %s best - Optuna TPE best: %+.4f (pooled std %.4f): %s; study wall %.2fx Optuna's" %
                      (LABELS[ours], diff, pooled, verdict, r[key]["wall_ratio"]))
            if "tpe+asha" in sm and "random" in sm:
                ta, rd = sm["tpe+asha"], sm["random"]
                ratio = ta["time_to_target_mean"] / rd["time_to_target_mean"]
                r["time_to_target_tpe_asha_over_random"] = ratio
                note = ""
                if ta["reached"] < ta["seeds"] or rd["reached"] < rd["seeds"]:
                    note = " (not every study reached the target: TPE+ASHA %d/%d, random %d/%d; spans counted)" % (
                        ta["reached"], ta["seeds"], rd["reached"], rd["seeds"])
                print("  time to target, TPE+ASHA / random: %.2fx%s" % (ratio, note))
            ratios[problem] = r

        if a.out:
            os.makedirs(a.out, exist_ok=True)
            with open(os.path.join(a.out, "bench_tuning.json"), "w") as f:
                json.dump({"quick": a.quick, "trials": a.trials, "seeds": a.seeds, "parallel": a.parallel,
                           "methods": methods, "targets": {p: targets[p] for p in problems},
                           "problems": {p: {"base": bases[p], "space": PROBLEMS[p]["space"]} for p in problems},
                           "summary": summary, "ratios": ratios, "studies": studies}, f, indent=2)
    except Broken as e:
        print("bench_tuning: FAILED: %s" % e)
        return 1
    except subprocess.TimeoutExpired as e:
        print("bench_tuning: FAILED: timed out after %.0f s: %s" % (e.timeout, " ".join(e.cmd)))
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
