#!/usr/bin/env bash
# fuzz.sh: fuzzes the payload decoder and the apply path behind it for a bounded time with clang
# libFuzzer under AddressSanitizer and UndefinedBehaviorSanitizer (docs/fuzzing.md).
#
# Steps: build the target (tests/fuzz/fuzz_payload_decoder.cpp) and the seed generator with
# clang++ (rebuilt only when a header, a fuzz source or this script changed); write the seed
# corpus; replay every input in tests/fuzz/regressions/; fuzz for --seconds from the seeds and
# the corpus kept by earlier runs. Exit status 0 only if nothing crashed: any crash, sanitizer
# report, property violation, timeout or out-of-memory fails the run (exit 1) and the input that
# caused it stays in $build/artifacts/ (crash-*, timeout-*, oom-*, leak-*). Reproduce with
#   $build/fuzz_payload_decoder $build/artifacts/crash-...
# A missing clang++ or libFuzzer runtime is an error too (scripts/install-deps.sh installs both).
#
# Usage: scripts/fuzz.sh [--seconds N] [--jobs J] [-- LIBFUZZER_FLAG...]
#   --seconds N  fuzzing time in seconds (default 300); 0 builds and replays seeds and
#                regressions only
#   --jobs J     parallel fuzzing processes (libFuzzer -fork=J; default 1)
#   after --      extra flags for libFuzzer (e.g. -max_len=65536)
# Environment: DCR_FUZZ_BUILD   build and output folder (default build-fuzz/ at the repository root)
#              DCR_FUZZ_CXX     the clang++ to use (default: clang++, else clang++-19 ... -14)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
seconds=300
jobs=1
extra=()
while (($#)); do
  case $1 in
    --seconds) seconds=${2:?--seconds needs a value}; shift 2 ;;
    --jobs) jobs=${2:?--jobs needs a value}; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "fuzz.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ $seconds =~ ^[0-9]+$ ]] || { echo "fuzz.sh: --seconds must be a whole number" >&2; exit 2; }
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "fuzz.sh: --jobs must be a positive number" >&2; exit 2; }

build=${DCR_FUZZ_BUILD:-$root/build-fuzz}
mkdir -p "$build"
build=$(cd "$build" && pwd)
fuzz_dir=$root/tests/fuzz
target=$build/fuzz_payload_decoder
make_seeds=$build/make_seeds
hint="fuzz.sh: clang++ with its libFuzzer and sanitizer runtimes is required; scripts/install-deps.sh installs clang and libclang-rt-14-dev"

# ---- Compiler.
cxx=${DCR_FUZZ_CXX:-}
if [[ -z $cxx ]]; then
  for c in clang++ clang++-19 clang++-18 clang++-17 clang++-16 clang++-15 clang++-14; do
    if command -v "$c" >/dev/null; then cxx=$c; break; fi
  done
fi
if [[ -z $cxx ]] || ! command -v "$cxx" >/dev/null; then
  echo "$hint (no clang++ found)" >&2
  exit 1
fi

common=(-std=c++20 -O1 -g -fno-omit-frame-pointer -fno-sanitize-recover=undefined
        -Wall -Wextra -Wpedantic -I"$root/include" -I"$root/kernels")
target_flags=("${common[@]}" -fsanitize=fuzzer,address,undefined)
seeds_flags=("${common[@]}" -fsanitize=address,undefined)
libs=(-lzstd -lxxhash)

# ---- Build, when anything it depends on changed (or the flags did).
stamp=$build/build-flags
want="$("$cxx" --version | head -1) | ${target_flags[*]} | ${seeds_flags[*]}"
stale=false
if [[ ! -x $target || ! -x $make_seeds || ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  stale=true
elif [[ -n $(find "$root/include" "$root/kernels" "$fuzz_dir" "${BASH_SOURCE[0]}" -newer "$target" \
             \( -name '*.hpp' -o -name '*.cpp' -o -name '*.cuh' -o -name '*.h' -o -name '*.sh' \) \
             -print -quit) ]]; then
  stale=true
fi
if $stale; then
  echo "fuzz.sh: building with $cxx into $build"
  rm -f "$stamp"
  # A one-line target first, so a missing libFuzzer or sanitizer runtime gets its own message.
  if ! echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' |
       "$cxx" -x c++ - -fsanitize=fuzzer,address,undefined -o "$build/runtime-probe" 2>"$build/runtime-probe.log"; then
    cat "$build/runtime-probe.log" >&2
    echo "$hint ($cxx cannot link -fsanitize=fuzzer,address,undefined)" >&2
    exit 1
  fi
  rm -f "$build/runtime-probe" "$build/runtime-probe.log"
  "$cxx" "${target_flags[@]}" "$fuzz_dir/fuzz_payload_decoder.cpp" -o "$target.tmp" "${libs[@]}" &
  target_pid=$!
  seeds_ok=true
  "$cxx" "${seeds_flags[@]}" "$fuzz_dir/make_seeds.cpp" -o "$make_seeds.tmp" "${libs[@]}" || seeds_ok=false
  target_ok=true
  wait "$target_pid" || target_ok=false
  if ! $target_ok || ! $seeds_ok; then
    echo "fuzz.sh: build failed" >&2
    echo "$hint" >&2
    exit 1
  fi
  mv "$target.tmp" "$target"
  mv "$make_seeds.tmp" "$make_seeds"
  echo "$want" > "$stamp"
fi

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# ---- Seeds (regenerated every run: they follow the current encoder and format).
seeds=$build/seeds
rm -rf "$seeds"
mkdir -p "$seeds"
"$make_seeds" "$seeds"

# Per input: 60 s before a slow input counts as a hang (a hostile count of 4M records takes
# seconds under the sanitizers on a loaded machine); 4 GiB of memory before it counts as a leak
# of bounds.
limits=(-timeout=60 -rss_limit_mb=4096 -max_len=8192)

# ---- Regressions: inputs that once crashed must all pass now.
shopt -s nullglob
regressions=("$fuzz_dir"/regressions/*)
shopt -u nullglob
if ((${#regressions[@]})); then
  echo "fuzz.sh: replaying ${#regressions[@]} regression input(s) from tests/fuzz/regressions/"
  if ! "$target" "${limits[@]}" "${regressions[@]}" >"$build/regressions.log" 2>&1; then
    cat "$build/regressions.log" >&2
    echo "fuzz.sh: FAILED: a regression input crashes again (log: $build/regressions.log)" >&2
    exit 1
  fi
fi

artifacts=$build/artifacts
corpus=$build/corpus
mkdir -p "$artifacts" "$corpus"
marker=$build/.run-start
touch "$marker"

run=("$target" "${limits[@]}" -dict="$fuzz_dir/payload.dict" -artifact_prefix="$artifacts/"
     -print_final_stats=1)
if ((seconds == 0)); then
  echo "fuzz.sh: replaying the seed corpus"
  run+=(-runs=0 "$seeds")
else
  echo "fuzz.sh: fuzzing for $seconds s with $jobs process(es); corpus $corpus"
  run+=(-max_total_time="$seconds" "$corpus" "$seeds")
  if ((jobs > 1)); then run+=(-fork="$jobs"); fi
fi
run+=("${extra[@]}")

# The full log goes to last-run.log; the console skips the per-input NEW/REDUCE lines.
set +e
"${run[@]}" 2>&1 | tee "$build/last-run.log" | grep --line-buffered -v -E '^(#[0-9]+[[:space:]]+(NEW|REDUCE)|[[:space:]]+NEW_FUNC)'
status=${PIPESTATUS[0]}
set -e

mapfile -t found < <(find "$artifacts" -maxdepth 1 -type f -newer "$marker" \
                      \( -name 'crash-*' -o -name 'timeout-*' -o -name 'oom-*' -o -name 'leak-*' \) | sort)
if ((status != 0 || ${#found[@]})); then
  echo "fuzz.sh: FAILED (libFuzzer exit status $status; full log: $build/last-run.log)" >&2
  for f in "${found[@]}"; do
    echo "fuzz.sh: failing input kept: $f" >&2
    echo "fuzz.sh:   reproduce with: $target $f" >&2
  done
  exit 1
fi
echo "fuzz.sh: passed (corpus now $(find "$corpus" -type f | wc -l) inputs)"
