#!/bin/sh
# fuzz.torchscript_graph: writes a small traced CNN with Debian's python3-torch (exit 77, skipped,
# without it) and damages it at random for at most MAX_RUNS inputs or MAX_SECONDS seconds.
#   run_fuzz_torchscript.sh HARNESS ARTIFACT_PREFIX MAX_RUNS MAX_SECONDS
set -u
harness=$1 prefix=$2 runs=$3 seconds=$4
/usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "skipped: Debian's python3-torch is not installed"; exit 77; }
d=$(mktemp -d) || exit 1
trap 'rm -rf "$d"' EXIT
/usr/bin/python3 -c "
import torch
m = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                        torch.nn.Flatten(), torch.nn.Linear(144, 3)).eval()
torch.jit.trace(m, torch.rand(1, 1, 8, 8)).save('$d/seed.pt')
" || exit 1
"$harness" "$d/seed.pt" "$runs" "$seconds" "$prefix"
