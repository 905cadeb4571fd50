#!/usr/bin/python3
"""bench_data_loader: Lathe's data loader vs PyTorch's DataLoader with PIL and torchvision.

Side by side in one run, on the same image folder (written by bench_data_loader --make: the
built-in digits drawn at SIDE x SIDE pixels, 10 classes, JPEG and PNG alternating), with the same
steps and the same number of workers W:

  decode (PIL / TurboJPEG + libpng), resize the shorter side to 72 (bilinear, antialiased),
  random crop 64, random horizontal flip, to float CHW, ImageNet normalisation, batches of 32,
  shuffled.

  PyTorch: torchvision.datasets.ImageFolder + transforms.Compose([Resize(72), RandomCrop(64),
           RandomHorizontalFlip(), ToTensor(), Normalize(imagenet)]), DataLoader(batch_size=32,
           shuffle=True, num_workers=W, persistent_workers=True when W > 0). Its epochs are all
           alike (it has no cache): the best of its epochs is reported, its first (which starts
           the worker processes) included in the table.
  Lathe:   the loader with W threads and a 512 MB memory cache: epoch 1 starts cold (nothing
           cached: every image decoded and resized), epoch 2 is warm (the resized images cached,
           crops, flips and normalisation done again).

Every epoch walks every image once; the files are in the page cache for both (they were just
written). Reps alternate which side goes first; the median is kept. Prints samples/s and the
ratios: Lathe cold / PyTorch (target >= 2x at equal workers), Lathe warm / Lathe cold (target
>= 5x) and the second epoch's memory-cache hit rate (target >= 90%).

Exit codes: 0 = measured (whatever the ratios), 1 = something broke, 77 = skipped (no torch or
torchvision in /usr/bin/python3).
"""
import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SKIP = 77


def lathe_epochs(binary, folder, workers, epochs):
    out = subprocess.run([binary, "--dir", folder, "--workers", str(workers), "--epochs", str(epochs)],
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit("bench_data_loader failed: " + out.stderr)
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def torch_epochs(folder, workers, epochs):
    import torch
    from torchvision import datasets, transforms
    torch.set_num_threads(1)
    tf = transforms.Compose([
        transforms.Resize(72),
        transforms.RandomCrop(64),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])
    ds = datasets.ImageFolder(folder, transform=tf)
    loader = torch.utils.data.DataLoader(ds, batch_size=32, shuffle=True, num_workers=workers,
                                         persistent_workers=workers > 0)
    rows = []
    for e in range(epochs):
        t0 = time.perf_counter()
        n = 0
        checksum = 0.0
        for x, y in loader:
            n += x.shape[0]
            checksum += float(x[0, 0, 0, 0])
        s = time.perf_counter() - t0
        rows.append({"epoch": e + 1, "samples": n, "seconds": s, "samples_per_s": n / s})
    del loader
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True, help="the bench_data_loader program")
    ap.add_argument("--out", default="")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--workers", default="2", help="comma-separated worker counts")
    ap.add_argument("--per-class", type=int, default=0)
    ap.add_argument("--side", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=0)
    a = ap.parse_args()
    try:
        import torch  # noqa: F401
        import torchvision  # noqa: F401
        import PIL  # noqa: F401
    except ImportError as e:
        print("SKIPPED: /usr/bin/python3 has no torch/torchvision/PIL (%s)" % e)
        return SKIP
    per_class = a.per_class or (60 if a.quick else 170)
    repeats = a.repeats or (1 if a.quick else 3)
    tmp = tempfile.mkdtemp(prefix="lathe-bench-loader-")
    try:
        folder = os.path.join(tmp, "images")
        subprocess.run([a.bench, "--make", folder, "--per-class", str(per_class), "--side", str(a.side)],
                       check=True, capture_output=True)
        images = sum(len(f) for _, _, f in os.walk(folder))
        print("%d images of %dx%d (JPEG and PNG), %s, %d cores" %
              (images, a.side, a.side, platform.processor() or platform.machine(), os.cpu_count()))
        results = []
        for w in [int(x) for x in a.workers.split(",")]:
            lathe_cold, lathe_warm, hit, torch_best, torch_first = [], [], [], [], []
            for r in range(repeats):
                order = ["lathe", "torch"] if r % 2 == 0 else ["torch", "lathe"]
                for side in order:
                    if side == "lathe":
                        rows = lathe_epochs(a.bench, folder, w, 2)
                        lathe_cold.append(rows[0]["samples_per_s"])
                        lathe_warm.append(rows[1]["samples_per_s"])
                        hit.append(rows[1].get("hit_memory", 0.0))
                    else:
                        rows = torch_epochs(folder, w, 2)
                        torch_first.append(rows[0]["samples_per_s"])
                        torch_best.append(max(r["samples_per_s"] for r in rows))
            res = {
                "workers": w,
                "images": images,
                "torch_samples_per_s": statistics.median(torch_best),
                "torch_first_epoch_samples_per_s": statistics.median(torch_first),
                "lathe_cold_samples_per_s": statistics.median(lathe_cold),
                "lathe_warm_samples_per_s": statistics.median(lathe_warm),
                "warm_hit_rate_memory": statistics.median(hit),
            }
            res["cold_vs_torch"] = res["lathe_cold_samples_per_s"] / res["torch_samples_per_s"]
            res["warm_vs_torch"] = res["lathe_warm_samples_per_s"] / res["torch_samples_per_s"]
            res["warm_vs_cold"] = res["lathe_warm_samples_per_s"] / res["lathe_cold_samples_per_s"]
            results.append(res)
        print("%-8s %14s %14s %14s %14s %10s %10s %10s %8s" %
              ("workers", "torch/s", "torch 1st/s", "lathe cold/s", "lathe warm/s", "cold/torch",
               "warm/torch", "warm/cold", "hit"))
        for r in results:
            print("%-8d %14.0f %14.0f %14.0f %14.0f %9.2fx %9.2fx %9.2fx %7.0f%%" %
                  (r["workers"], r["torch_samples_per_s"], r["torch_first_epoch_samples_per_s"],
                   r["lathe_cold_samples_per_s"], r["lathe_warm_samples_per_s"], r["cold_vs_torch"],
                   r["warm_vs_torch"], r["warm_vs_cold"], 100 * r["warm_hit_rate_memory"]))
        print("targets: cold/torch >= 2x at equal workers, warm/cold >= 5x, second-epoch hit rate >= 90%")
        if a.out:
            os.makedirs(a.out, exist_ok=True)
            with open(os.path.join(a.out, "bench_data_loader.json"), "w") as f:
                json.dump({"results": results, "repeats": repeats, "side": a.side}, f, indent=2)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
