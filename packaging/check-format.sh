#!/usr/bin/env bash
# Checks that every C++ and CUDA source of the tree is formatted as .clang-format says (Debian's
# clang-format 14), so style never needs a review. Fix with:
#   clang-format -i $(git ls-files '*.cpp' '*.h' '*.cu')
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
command -v clang-format >/dev/null || { echo "SKIPPED: clang-format is not installed (packaging/deps-debian.sh installs it)"; exit 77; }
cd "$root"
mapfile -t files < <(find app core kernels remote tests widgets -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' \) | sort)
if ! out=$(clang-format --dry-run -Werror "${files[@]}" 2>&1); then
    printf '%s\n' "$out" | grep -E ': error:' | sed -E 's/:[0-9]+:[0-9]+: error:.*//' | sort -u | head -n 40
    echo "check-format: the files above are not formatted; run: clang-format -i <file>" >&2
    exit 1
fi
echo "check-format: ${#files[@]} files formatted as .clang-format says"
