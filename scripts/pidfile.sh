# Sourced by the up/down scripts of scripts/{slurm,sshd,containers} (one reading of a daemon's pid file):
#   pid_of PIDFILE COMM   prints the pid, and succeeds, when PIDFILE names a live daemon named COMM.
# The state directories under /var/tmp outlive their daemons (a machine whose processes were all killed, or a
# restart), and pids come round again (pid_max is often 32768): a stale slurmd-n2.pid once named the live slurmd of
# n1, so n2 was taken for running and never started. A pid file counts only when its process is named COMM, is not a
# zombie (a lazy pid 1 may not have reaped it yet), and started no later than the file was written: a daemon writes
# its pid file after it starts, and a process that reused the pid started after.
pid_of() {
  local f=$1 comm=$2 pid stat btime started written
  [[ -r $f ]] || return 1
  pid=$(tr -dc '0-9' < "$f")
  [[ -n $pid && "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$comm" ]] || return 1
  ! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null || return 1
  # Field 22 of /proc/PID/stat is the start time in clock ticks after boot (fields counted after the "(comm)").
  stat=$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null) || return 1
  btime=$(awk '/^btime/ {print $2}' /proc/stat)
  started=$((btime + $(awk '{print $20}' <<< "$stat") / $(getconf CLK_TCK)))
  written=$(stat -c %Y "$f") || return 1
  # (2 s of slack: btime is whole seconds and may move by one.)
  ((started <= written + 2)) || return 1
  echo "$pid"
}
