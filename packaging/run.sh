#!/usr/bin/env bash
# Installs what is missing, builds, and starts the Lathe workbench.
#   ./packaging/run.sh [--db PATH]             the GUI (lathe)
#   ./packaging/run.sh --headless [FLAGS...]   no display: the demo pipeline, i.e. train the
#                                              built-in MLP on digits into the default workspace,
#                                              register and deploy it, load-test it, undeploy it
# Without a display (no $DISPLAY / $WAYLAND_DISPLAY) the headless demo is chosen.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="${LATHE_BUILD_DIR:-$root/build}"

headless=0
args=()
for a in "$@"; do
  if [[ "$a" == "--headless" ]]; then headless=1; else args+=("$a"); fi
done
if [[ -z "${DISPLAY:-}" && -z "${WAYLAND_DISPLAY:-}" ]]; then
  [[ $headless == 1 ]] || echo "run.sh: no display found; running the headless demo instead of the GUI"
  headless=1
fi

if [[ $headless == 1 ]]; then
  "$root/packaging/deps-debian.sh" --headless
  # Only lathectl is needed; keep the GUI on in the build tree when Qt is there, so switching
  # between run.sh and test.sh does not reconfigure and rebuild.
  gui=ON
  dpkg-query -W -f='${Status}' qt6-base-dev libqcustomplot-dev 2>/dev/null | grep -q "install ok installed.*install ok installed" || gui=OFF
  LATHE_CMAKE_ARGS="${LATHE_CMAKE_ARGS:-} -DLATHE_GUI=$gui" "$root/packaging/build.sh" lathectl
  echo
  echo "== Lathe demo: training the built-in MLP on the UCI digits data set =="
  "$build/bin/lathectl" train --model mlp --data digits --name demo --experiment demo ${args[@]+"${args[@]}"}
  # The newest runs of the same workspace (only --db / LATHE_DB matter here).
  db=()
  for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[$i]}" in
      --db) db=(--db "${args[$((i + 1))]:-}") ;;
      --db=*) db=("${args[$i]}") ;;
    esac
  done
  echo
  "$build/bin/lathectl" runs list ${db[@]+"${db[@]}"} | head -n 6 || true
  # The serving half: register the run's model, deploy it, put load on it, take it down.
  run_id=$("$build/bin/lathectl" runs list --json ${db[@]+"${db[@]}"} | grep -m1 -o '"id": *[0-9]*' | grep -o '[0-9]*$')
  echo
  echo "== Registering run $run_id as model demo-digits and deploying it =="
  "$build/bin/lathectl" models register demo-digits --run "$run_id" --alias production ${db[@]+"${db[@]}"}
  url=$("$build/bin/lathectl" deploy demo-digits@production --json ${db[@]+"${db[@]}"} | grep -o '"url": *"[^"]*"' | grep -o 'http[^"]*')
  trap '"$build/bin/lathectl" undeploy demo-digits ${db[@]+"${db[@]}"} >/dev/null 2>&1 || true' EXIT
  echo "serving at $url — 3 s of load at 200 requests/s:"
  "$build/bin/lathectl" load --url "$url" --model demo-digits --rate 200 --duration 3 --record ${db[@]+"${db[@]}"}
  echo
  "$build/bin/lathectl" deployments demo-digits ${db[@]+"${db[@]}"} | head -n 4
  exit 0
fi

"$root/packaging/deps-debian.sh"
LATHE_CMAKE_ARGS="${LATHE_CMAKE_ARGS:-} -DLATHE_GUI=ON" "$root/packaging/build.sh" lathe
exec "$build/bin/lathe" ${args[@]+"${args[@]}"}
