#!/usr/bin/env bash
# tests/io/tool_test.sh: multi-step tests of `dcr diff|apply|inspect|recover` as a user runs them.
#
#   tool_test.sh SCENARIO DCR MAKE_CHECKPOINTS
#
# Each scenario generates a checkpoint pair with MAKE_CHECKPOINTS in a scratch directory and
# exits 0 only if every step behaved as documented in docs/tool.md. `wrong-base-exit` ends with
# dcr's own exit status (a should_fail test).
set -euo pipefail

scenario=$1
dcr=$(realpath "$2")
make_checkpoints=$(realpath "$3")

work=$(mktemp -d "${TMPDIR:-/tmp}/dcr-tool-XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
changed=$("$make_checkpoints" ckpt --elements 400000 --rate 0.02)
old=ckpt/old.safetensors
new=ckpt/new.safetensors
other=ckpt/other.safetensors

fail() {
  echo "FAIL ($scenario): $*" >&2
  exit 1
}
# expect_status WANT CMD...: runs CMD, output to out.txt/err.txt, and checks its exit status.
expect_status() {
  local want=$1
  shift
  set +e
  "$@" >out.txt 2>err.txt
  local got=$?
  set -e
  if [ "$got" -ne "$want" ]; then
    cat out.txt err.txt >&2
    fail "'$*' exited $got, expected $want"
  fi
}
expect_in() {  # expect_in FILE TEXT
  grep -q -- "$2" "$1" || { cat "$1" >&2; fail "'$2' not in $1"; }
}
# Nothing but the expected files may remain in ckpt/ (no temporaries, journals, working files).
expect_files() {
  local got
  got=$(cd ckpt && ls -A | tr '\n' ' ')
  [ "$got" = "$1" ] || fail "ckpt/ holds '$got', expected '$1'"
}

case "$scenario" in
  roundtrip-*)
    encoding=${scenario#roundtrip-}
    cp "$old" old.copy
    "$dcr" diff "$old" "$new" -o ckpt/step.dcrdelta --encoding "$encoding" --json >diff.json
    for key in changed_elements delta_bytes checkpoint_bytes bytes_per_changed seconds; do
      expect_in diff.json "\"$key\":"
    done
    expect_in diff.json "\"changed_elements\": $changed,"
    size=$(stat -c %s ckpt/step.dcrdelta)
    expect_in diff.json "\"delta_bytes\": $size,"
    "$dcr" apply ckpt/step.dcrdelta "$old" -o ckpt/out.safetensors
    cmp ckpt/out.safetensors "$new" || fail "apply's output differs from NEW"
    cmp "$old" old.copy || fail "apply changed OLD"
    expect_files "new.safetensors old.safetensors other.safetensors out.safetensors step.dcrdelta "
    ;;
  in-place)
    "$dcr" diff "$old" "$new" -o ckpt/step.dcrdelta
    cp "$old" ckpt/base.safetensors
    "$dcr" apply ckpt/step.dcrdelta ckpt/base.safetensors --in-place --json >apply.json
    expect_in apply.json "\"changed_elements\": $changed,"
    cmp ckpt/base.safetensors "$new" || fail "in-place result differs from NEW"
    expect_status 0 "$dcr" apply ckpt/step.dcrdelta ckpt/base.safetensors --in-place
    expect_in out.txt "already holds the delta's result"
    cmp ckpt/base.safetensors "$new" || fail "second in-place apply changed the result"
    expect_files "base.safetensors new.safetensors old.safetensors other.safetensors step.dcrdelta "
    ;;
  crash-recovery)
    "$dcr" diff "$old" "$new" -o ckpt/step.dcrdelta --payload-records 5000
    for step in journal-written journal-committed base-hidden half-written written verified \
                renamed-back; do
      for finish in recover apply; do
        cp "$old" ckpt/base.safetensors
        expect_status 86 env DCR_CRASH_AT="$step" \
          "$dcr" apply ckpt/step.dcrdelta ckpt/base.safetensors --in-place
        if [ -e ckpt/base.safetensors ]; then
          cmp -s ckpt/base.safetensors "$old" || cmp -s ckpt/base.safetensors "$new" \
            || fail "after a crash at $step BASE is neither OLD nor NEW"
        fi
        if [ "$finish" = recover ]; then
          "$dcr" recover ckpt/base.safetensors
          if [ "$step" = journal-written ]; then
            cmp ckpt/base.safetensors "$old" || fail "recover after $step changed BASE"
            "$dcr" apply ckpt/step.dcrdelta ckpt/base.safetensors --in-place
          fi
        else
          "$dcr" apply ckpt/step.dcrdelta ckpt/base.safetensors --in-place
        fi
        cmp ckpt/base.safetensors "$new" || fail "crash at $step then $finish: BASE is not NEW"
        expect_files "base.safetensors new.safetensors old.safetensors other.safetensors step.dcrdelta "
        rm ckpt/base.safetensors
      done
    done
    expect_status 1 env DCR_CRASH_AT=no-such-step \
      "$dcr" apply ckpt/step.dcrdelta "$old" --in-place
    expect_in err.txt "is not a step"
    ;;
  wrong-base)
    "$dcr" diff "$old" "$new" -o ckpt/step.dcrdelta
    expect_status 4 "$dcr" apply ckpt/step.dcrdelta "$other" -o ckpt/out.safetensors
    expect_in err.txt "verification failed"
    expect_in err.txt "wrong base"
    expect_in err.txt "its tensors have digest"
    cp "$other" ckpt/base.safetensors
    expect_status 4 "$dcr" apply ckpt/step.dcrdelta ckpt/base.safetensors --in-place
    cmp ckpt/base.safetensors "$other" || fail "a refused in-place apply changed BASE"
    rm ckpt/base.safetensors
    expect_files "new.safetensors old.safetensors other.safetensors step.dcrdelta "
    ;;
  wrong-base-exit)
    "$dcr" diff "$old" "$new" -o ckpt/step.dcrdelta
    status=0
    "$dcr" apply ckpt/step.dcrdelta "$other" -o ckpt/out.safetensors || status=$?
    exit "$status"
    ;;
  corrupt)
    "$dcr" diff "$old" "$new" -o ckpt/step.dcrdelta
    size=$(stat -c %s ckpt/step.dcrdelta)
    for at in 20 100 $((size / 2)) $((size - 3)); do
      cp ckpt/step.dcrdelta bad.dcrdelta
      printf '\x5a' | dd of=bad.dcrdelta bs=1 seek="$at" conv=notrunc status=none
      expect_status 5 "$dcr" apply bad.dcrdelta "$old" -o ckpt/out.safetensors
      expect_in err.txt "error \["
      expect_status 5 "$dcr" inspect bad.dcrdelta
    done
    head -c $((size - 100)) ckpt/step.dcrdelta >bad.dcrdelta
    expect_status 5 "$dcr" apply bad.dcrdelta "$old" -o ckpt/out.safetensors
    expect_in err.txt "truncated"
    expect_files "new.safetensors old.safetensors other.safetensors step.dcrdelta "
    ;;
  inspect)
    "$dcr" diff "$old" "$new" -o ckpt/step.dcrdelta --payload-records 20000
    # Without its base a delta names no tensor; with it, names and the result's metadata.
    "$dcr" inspect ckpt/step.dcrdelta --json >inspect.json
    expect_in inspect.json '"tensors": null'
    expect_in inspect.json "\"records\": $changed,"
    "$dcr" inspect ckpt/step.dcrdelta "$old" --json >inspect.json
    for key in kind format_version registry_fingerprint tensors payloads base_digest \
               result_digest base_header_digest target_header_digest items encoding \
               location_coding value_coding location_bytes value_raw_bytes metadata; do
      expect_in inspect.json "\"$key\":"
    done
    expect_in inspect.json "\"records\": $changed,"
    expect_in inspect.json '"step": "0002"'
    expect_in inspect.json '"name": "model.layers.0.fp8_e4m3"'
    "$dcr" inspect ckpt/step.dcrdelta "$old" >inspect.txt
    expect_in inspect.txt "model.norm.weight"
    expect_status 4 "$dcr" inspect ckpt/step.dcrdelta "$new"
    expect_in err.txt "wrong base"
    # The target header decodes by hand as docs/tool.md shows: zstd with the base's header
    # content as its dictionary gives NEW's header bytes.
    python3 -c 'import sys, struct; b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]; sys.stdout.buffer.write(b[8:8 + n].rstrip(b" "))' \
      "$old" >base.json
    size=$(od -An -tu8 -j64 -N8 ckpt/step.dcrdelta | tr -d " ")
    dd if=ckpt/step.dcrdelta of=target.zst bs=1 skip=136 count=$size status=none
    zstd -q -d -D base.json target.zst -o target.json
    python3 -c 'import sys, struct; b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]; sys.exit(open(sys.argv[2], "rb").read() != b[8:8 + n])' \
      "$new" target.json || fail "the target header does not decode by hand as documented"
    ;;
  usage)
    "$dcr" diff "$old" "$new" -o ckpt/step.dcrdelta
    expect_status 2 "$dcr" diff "$old" "$new"
    expect_status 2 "$dcr" diff "$old" "$new" -o x --no-such-flag
    expect_status 2 "$dcr" diff "$old" -o x
    expect_status 2 "$dcr" diff "$old" "$new" -o x --encoding fancy
    expect_status 2 "$dcr" diff "$old" "$new" -o x --level 99
    expect_status 2 "$dcr" diff "$old" "$new" -o x --payload-records 0
    expect_status 2 "$dcr" apply ckpt/step.dcrdelta "$old"
    expect_status 2 "$dcr" apply ckpt/step.dcrdelta "$old" -o x --in-place
    expect_status 2 "$dcr" inspect
    expect_status 2 "$dcr" recover
    expect_status 2 "$dcr" no-such-command
    expect_status 0 "$dcr" diff --help
    expect_in out.txt "usage: dcr diff"
    expect_status 7 "$dcr" diff "$old" ckpt/missing.safetensors -o x
    expect_in err.txt "missing.safetensors"
    [ ! -e x ] || fail "a failed diff left its output"
    ;;
  *)
    fail "unknown scenario"
    ;;
esac
echo "ok: $scenario"
