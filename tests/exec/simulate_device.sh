#!/usr/bin/env bash
# simulate_device.sh SCENARIO DCR BACKEND [ARGS...]: `dcr simulate --device` as a user runs it.
# BACKEND is with-cuda-backend or without-cuda-backend (how meson configured the tool).
#   cuda      `dcr simulate --device cuda ARGS --json`. Where a CUDA device is present
#             (nvidia-smi lists one) and the tool has the CUDA backend: exit 0, every step
#             bit-exact, detect and apply reported on cuda. Otherwise: exit status 3 (the tool
#             checks before starting any process), a JSON error object (code device_error) naming what is missing, and the
#             same reason on stderr. A machine with a GPU never passes through the error branch.
#   bogus     `--device bogus`: a usage error (status 2) naming the flag.
#   cpu-exec  `--device cpu ARGS --json` with DCR_SIMULATE_CPU_BACKENDS=1: the device plumbing on
#             the CPU policy; exit 0, bit-exact, detect and apply reported on cpu-exec.
set -uo pipefail
scenario=$1 dcr=$2 backend=$3
shift 3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; echo "--- stdout" >&2; cat "$work/out" >&2; echo "--- stderr" >&2; cat "$work/err" >&2; exit 1; }
field() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$work/out" "$1"; }

gpu_present=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then gpu_present=1; fi

case $scenario in
  cuda)
    "$dcr" simulate --device cuda "$@" --json >"$work/out" 2>"$work/err"
    rc=$?
    if [[ $gpu_present -eq 1 && $backend == with-cuda-backend ]]; then
      [[ $rc -eq 0 ]] || fail "a CUDA device is present (nvidia-smi) but --device cuda exited $rc"
      [[ $(field "d['all_bit_exact']") == True ]] || fail "not bit-exact on the GPU"
      [[ $(field "d['stage_devices']['detect']") == cuda ]] || fail "detect did not run on cuda"
      [[ $(field "d['stage_devices']['apply']") == cuda ]] || fail "apply did not run on cuda"
      [[ $(field "d['device']['description']") == cuda:* ]] || fail "no device description"
      echo "--device cuda on $(field "d['device']['description']"): every step bit-exact"
    else
      [[ $rc -eq 3 ]] || fail "expected exit status 3 (device unavailable), got $rc"
      [[ $(field "d['error']['code']") == device_error ]] || fail "no JSON error object"
      msg=$(field "d['error']['message']")
      if [[ $gpu_present -eq 1 ]]; then
        [[ $msg == *"no CUDA backend"* ]] || fail "a GPU is present: only a missing backend may stop it ($msg)"
      else
        [[ $msg == *"no CUDA device present ("*")"* ]] || fail "message does not say no device is present, and why: $msg"
      fi
      grep -q -- "error \[device error\]: --device cuda: " "$work/err" || fail "no reason on stderr"
      echo "no device here, as reported: $msg"
    fi
    ;;
  bogus)
    "$dcr" simulate --device bogus >"$work/out" 2>"$work/err"
    rc=$?
    [[ $rc -eq 2 ]] || fail "expected usage error status 2, got $rc"
    grep -q "unknown device 'bogus'" "$work/err" || fail "the usage error does not name the device"
    ;;
  cpu-exec)
    DCR_SIMULATE_CPU_BACKENDS=1 "$dcr" simulate --device cpu "$@" --json >"$work/out" 2>"$work/err"
    rc=$?
    [[ $rc -eq 0 ]] || fail "exit $rc"
    [[ $(field "d['all_bit_exact']") == True ]] || fail "not bit-exact"
    [[ $(field "d['stage_devices']['detect']") == cpu-exec ]] || fail "detect did not run through the backend"
    [[ $(field "d['stage_devices']['apply']") == cpu-exec ]] || fail "apply did not run through the backend"
    ;;
  *) echo "unknown scenario $scenario" >&2; exit 2 ;;
esac
