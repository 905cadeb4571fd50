#!/bin/sh
# One bounded libFuzzer run of a fuzz target, as CTest's fuzz.* tests run it:
#   run_fuzz.sh TARGET CORPUS_DIR DICT ARTIFACT_PREFIX MAX_RUNS MAX_SECONDS [MAX_LEN]
# The seed corpus is copied to a scratch directory (libFuzzer adds what it finds to its first
# corpus directory, and the checked-in one must stay as it is). The run stops after MAX_RUNS
# inputs or MAX_SECONDS seconds, whichever comes first, and libFuzzer's last line says which
# ("Done N runs in S second(s)"). The seed differs from run to run, so that CI explores new
# inputs each time; it is printed first, and LATHE_FUZZ_SEED=N replays it (the same seed and
# corpus mutate the same way; a run cut short by the time limit covers a prefix of it). A
# failing input is kept as ARTIFACT_PREFIX* (crash-, leak-, timeout-...): `TARGET FILE` replays it.
set -u
if [ $# -ne 6 ] && [ $# -ne 7 ]; then
    echo "usage: $0 TARGET CORPUS_DIR DICT ARTIFACT_PREFIX MAX_RUNS MAX_SECONDS [MAX_LEN]" >&2
    exit 2
fi
target=$1 corpus=$2 dict=$3 prefix=$4 runs=$5 seconds=$6 maxlen=${7:-4096}
seed=${LATHE_FUZZ_SEED:-}
if [ -z "$seed" ]; then
    # 1..2^31-1 (libFuzzer reads -seed=0 as "pick one"): from the kernel's random source.
    seed=$(( $(od -An -N4 -tu4 /dev/urandom | tr -d ' ') % 2147483647 + 1 ))
    how="random"
else
    case $seed in
        *[!0-9]* | 0 | 00*) echo "LATHE_FUZZ_SEED must be a positive integer (got '$seed')" >&2; exit 2 ;;
    esac
    how="from LATHE_FUZZ_SEED"
fi
echo "fuzz: $(basename "$target") with seed $seed ($how; replay with LATHE_FUZZ_SEED=$seed)," \
     "at most $runs inputs or $seconds s, whichever comes first"
d=$(mktemp -d) || exit 1
cp "$corpus"/* "$d"/ || { rm -rf "$d"; exit 1; }
"$target" -seed="$seed" -runs="$runs" -max_total_time="$seconds" -max_len="$maxlen" \
    -artifact_prefix="$prefix" -dict="$dict" "$d"
rc=$?
rm -rf "$d"
if [ $rc -ne 0 ]; then
    echo "fuzz: FAILED with seed $seed (exit $rc); the input is kept as ${prefix}*;" \
         "replay it with '$target FILE', or the run with LATHE_FUZZ_SEED=$seed" >&2
fi
exit $rc
