# shellcheck shell=bash
# server-common.sh: what with-etcd.sh and with-s3.sh share (sourced, not run): a port check and
# running the command beside the server.

# True if something accepts connections on 127.0.0.1:$1.
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Runs "$@" and exits with its status. It runs in the background (keeping our stdin) so that a
# SIGINT or SIGTERM sent to the script reaches it at once instead of waiting for it to finish;
# bash runs traps only between commands. The caller's EXIT trap then stops the server.
run_beside_server() {
  "$@" <&0 &
  local cmd_pid=$! status
  # shellcheck disable=SC2064  # the pid is fixed now
  trap "kill -INT $cmd_pid 2>/dev/null || true" INT
  # shellcheck disable=SC2064
  trap "kill -TERM $cmd_pid 2>/dev/null || true" TERM
  while :; do
    status=0
    wait "$cmd_pid" || status=$?
    kill -0 "$cmd_pid" 2>/dev/null || break  # else a trap interrupted the wait: wait again
  done
  exit "$status"
}
