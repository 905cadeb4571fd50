#!/usr/bin/env bash
# Compile-checks every translation unit that includes LibTorch against LibTorch 2.x headers
# (Debian trixie's libtorch-dev, fetched into a scratch directory; nothing is installed), so
# code written against Debian 12's LibTorch 1.13 also builds where an official LibTorch 2.x is
# used (the GPU machine's PyTorch). Syntax and templates only: nothing is linked. Needs a
# configured build directory (compile_commands.json), default build/.
#     ./packaging/check-libtorch2.sh [BUILD_DIR] [FILE-SUBSTRING ...]
# CTest runs it as compat.libtorch2 (label compat).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
[ -f "$build/compile_commands.json" ] || { echo "no $build/compile_commands.json: configure first (./packaging/build.sh)" >&2; exit 2; }
scratch=${LATHE_TORCH2_DIR:-/tmp/lathe-libtorch2}
if [ ! -d "$scratch/root/usr/include/torch" ]; then
    mkdir -p "$scratch/lists/partial" "$scratch/archives/partial"
    rm -rf "$scratch/root.tmp" "$scratch"/*.deb  # what an interrupted run left
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" >"$scratch/sources.list"
    o=(-o "Dir::Etc::SourceList=$scratch/sources.list" -o Dir::Etc::SourceParts=/dev/null
       -o "Dir::State::Lists=$scratch/lists" -o "Dir::Cache::Archives=$scratch/archives")
    # Without the archive there is nothing to check against: 77 (CTest: skipped).
    apt-get "${o[@]}" update >/dev/null 2>&1 || { echo "SKIPPED: cannot reach Debian's archive for trixie"; exit 77; }
    (cd "$scratch" && apt-get "${o[@]}" download libtorch-dev >/dev/null 2>&1) ||
        { echo "SKIPPED: cannot download trixie's libtorch-dev"; exit 77; }
    dpkg -x "$scratch"/libtorch-dev_*.deb "$scratch/root.tmp" && mv "$scratch/root.tmp" "$scratch/root"
fi
# The NCCL path of the process group and reducer is checked too, against the CUDA toolkit's headers; Debian's CPU-only
# LibTorch lacks one generated CUDA header, stood in for here.
mkdir -p "$scratch/stub/c10/cuda/impl"
echo '#define C10_CUDA_BUILD_SHARED_LIBS' >"$scratch/stub/c10/cuda/impl/cuda_cmake_macros.h"
python3 - "$build/compile_commands.json" "$scratch/root/usr/include" "$scratch/stub" "$@" <<'PY'
import json, os, re, subprocess, sys, concurrent.futures as cf
cc, inc, stub, only = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
cuda = '/usr/local/cuda/include'
jobs = []
for e in json.load(open(cc)):
    cmd, f = e['command'], e['file']
    if 'torch/csrc/api/include' not in cmd or (only and not any(o in f for o in only)):
        continue
    cmd = cmd.replace('-isystem /usr/include/torch/csrc/api/include',
                      f'-isystem {inc} -isystem {inc}/torch/csrc/api/include')
    jobs.append((f, re.sub(r' -o \S+ -c ', ' -fsyntax-only -w ', cmd), e['directory']))
    if f.endswith(('core/src/distributed/process_group.cpp', 'core/src/distributed/reducer.cpp')) and os.path.exists(cuda + '/nccl.h'):
        nccl = cmd.replace(f'-isystem {inc} ', f'-isystem {inc} -isystem {stub} -isystem {cuda} ', 1)
        jobs.append((f + ' (USE_C10D_NCCL)', re.sub(r' -o \S+ -c ', ' -DUSE_C10D_NCCL -fsyntax-only -w ', nccl),
                     e['directory']))
def run(j):
    p = subprocess.run(j[1], shell=True, cwd=j[2], capture_output=True, text=True)
    return j[0], p.returncode, [l for l in p.stderr.splitlines() if 'error' in l]
bad = 0
with cf.ThreadPoolExecutor(2) as ex:
    for f, rc, errs in ex.map(run, jobs):
        if rc:
            bad += 1
            print('FAIL', f)
            for l in errs[:8]:
                print('   ', l[:300])
print(f'check-libtorch2: {len(jobs)} LibTorch translation units, {bad} fail against {inc}')
sys.exit(1 if bad else 0)
PY
