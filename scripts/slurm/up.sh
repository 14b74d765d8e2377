#!/usr/bin/env bash
# Bring up a real, single-host SLURM test cluster for the `slurm` test tier:
#   munged -> private mariadbd -> slurmdbd -> slurmctld -> slurmd n1 + n2 + n3
#
# Idempotent: every daemon that is already running (checked through its pid
# file) is left alone, so re-running on a live cluster just re-checks it and
# exits 0. All state (configs, spool, logs, pids, the MariaDB datadir) lives in
# $SLURMTRAIN_SLURM_DIR (default /var/tmp/slurmtrain-slurm); the only files
# written outside it are /etc/slurm/slurm.conf (a symlink, so clients work
# without SLURM_CONF), /etc/hosts lines for n1/n2/n3, and munge's usual paths.
#
# Readiness is always a bounded poll (SLURMTRAIN_SLURM_TIMEOUT seconds per
# step, default 60); on failure the tail of the relevant log is printed.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
STATE=${SLURMTRAIN_SLURM_DIR:-/var/tmp/slurmtrain-slurm}
TIMEOUT=${SLURMTRAIN_SLURM_TIMEOUT:-60}

# Non-default ports so we never fight with a system slurm/mariadb.
CTLD_PORT=16817
DBD_PORT=16819
DB_PORT=16306
NODES=(n1 n2 n3)
declare -A NODE_PORT=([n1]=17001 [n2]=17002 [n3]=17003)

ETC=$STATE/etc
RUN=$STATE/run
LOG=$STATE/log
DB_DIR=$STATE/mysql          # owned by the mysql user: datadir + socket + pid
DB_SOCK=$DB_DIR/mysqld.sock
DB_PID=$DB_DIR/mysqld.pid
export SLURM_CONF=$ETC/slurm.conf   # inherited by every daemon and client below

log() { echo "up.sh: $*"; }
die() { echo "up.sh: ERROR: $*" >&2; exit 1; }

# Print the last lines of a log (for failure messages).
show_log() {
  local f=$1
  if [[ -f $f ]]; then
    echo "----- last 40 lines of $f -----" >&2
    tail -n 40 "$f" >&2
    echo "-----" >&2
  else
    echo "(no log file at $f)" >&2
  fi
}

# pid_alive PIDFILE COMM: true if PIDFILE names a live daemon named COMM (scripts/pidfile.sh: stale files and
# reused pids do not count).
source "$HERE/../pidfile.sh"
pid_alive() { pid_of "$1" "$2" > /dev/null; }

# wait_for DESC LOGFILE PIDFILE COMM -- CMD...: poll CMD until it succeeds, for
# at most $TIMEOUT s. Gives up early if the daemon (PIDFILE/COMM, may be "")
# has died -- no point waiting a minute for a crashed process.
wait_for() {
  local desc=$1 logf=$2 pidf=$3 comm=$4
  shift 5
  local deadline=$((SECONDS + TIMEOUT)) grace=$((SECONDS + 5))
  until "$@" >/dev/null 2>&1; do
    # Daemonising processes write their pid file a moment after we start them.
    if [[ -n $pidf ]] && ((SECONDS > grace)) && ! pid_alive "$pidf" "$comm"; then
      show_log "$logf"
      die "$desc: $comm is not running (see $logf)"
    fi
    if ((SECONDS >= deadline)); then
      show_log "$logf"
      die "$desc: not ready after ${TIMEOUT}s (see $logf)"
    fi
    sleep 0.5
  done
}

# render TEMPLATE DEST: fill @NAME@ placeholders. Sets CHANGED=1 if DEST's
# content changed, so a live slurmctld can be told to re-read it.
CHANGED=0
render() {
  local tmp
  tmp=$(mktemp "$2.XXXXXX")
  sed -e "s|@STATE@|$STATE|g" \
      -e "s|@CTLD_HOST@|$CTLD_HOST|g" \
      -e "s|@CTLD_PORT@|$CTLD_PORT|g" \
      -e "s|@DBD_PORT@|$DBD_PORT|g" \
      -e "s|@DB_PORT@|$DB_PORT|g" \
      -e "s|@DB_PASS@|$DB_PASS|g" \
      -e "s|@N1_PORT@|${NODE_PORT[n1]}|g" \
      -e "s|@N2_PORT@|${NODE_PORT[n2]}|g" \
      -e "s|@N3_PORT@|${NODE_PORT[n3]}|g" \
      -e "s|@CPUS@|$CPUS|g" \
      -e "s|@MEM_MB@|$MEM_MB|g" \
      "$1" > "$tmp"
  if cmp -s "$tmp" "$2"; then
    rm -f "$tmp"
  else
    mv -f "$tmp" "$2"
    CHANGED=1
  fi
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# ---------------------------------------------------------------- preflight
[[ $EUID -eq 0 ]] || die "must run as root (starts daemons, writes /etc/slurm and /etc/hosts)"
for b in munged munge unmunge mariadbd mariadb-install-db mariadb mysqladmin \
         slurmdbd slurmctld slurmd sacctmgr scontrol sinfo; do
  command -v "$b" >/dev/null || die "$b not found; run scripts/slurm/install.sh first"
done

mkdir -p "$ETC" "$RUN" "$LOG" "$STATE/spool/ctld" "$DB_DIR"
for n in "${NODES[@]}"; do mkdir -p "$STATE/spool/slurmd/$n"; done
# mariadbd runs as mysql and must traverse the state dir.
chmod 755 "$STATE" "$ETC" "$RUN" "$LOG"
chown mysql:mysql "$DB_DIR"
chmod 750 "$DB_DIR"

# slurmctld insists that SlurmctldHost names this machine.
CTLD_HOST=$(hostname -s)
# Both emulated nodes report the whole host, so advertise its real CPU count
# (fewer would be fine, more makes slurmd mark the node invalid).
CPUS=$(nproc)
# 8000 MB per node, but never more than the host has (slurmd would drain the
# node with "Low RealMemory").
host_mb=$(awk '/^MemTotal:/ {print int($2/1024)}' /proc/meminfo)
MEM_MB=$((host_mb < 8000 ? host_mb : 8000))

# StoragePass: random per state dir, generated once, reused afterwards.
if [[ ! -s $ETC/dbpass ]]; then
  # (od reads exactly 16 bytes: no `tr </dev/urandom | head` SIGPIPE under pipefail)
  (umask 077; od -An -N16 -tx1 /dev/urandom | tr -d ' \n' > "$ETC/dbpass")
fi
DB_PASS=$(cat "$ETC/dbpass")

render "$HERE/slurm.conf.in" "$ETC/slurm.conf"
chmod 644 "$ETC/slurm.conf"
render "$HERE/slurmdbd.conf.in" "$ETC/slurmdbd.conf"
chown root:root "$ETC/slurmdbd.conf"
chmod 600 "$ETC/slurmdbd.conf"

# Clients (sbatch, sinfo, sacct, ...) without SLURM_CONF read
# /etc/slurm/slurm.conf: point it at the rendered file. Keep a foreign one.
mkdir -p /etc/slurm
if [[ -e /etc/slurm/slurm.conf && ! -L /etc/slurm/slurm.conf ]]; then
  mv /etc/slurm/slurm.conf /etc/slurm/slurm.conf.pre-slurmtrain
  log "moved existing /etc/slurm/slurm.conf to /etc/slurm/slurm.conf.pre-slurmtrain"
fi
ln -sfn "$ETC/slurm.conf" /etc/slurm/slurm.conf

# The emulated node names must resolve (slurmd -N n1 looks itself up).
# Append rather than rewrite: /etc/hosts is often a bind mount.
for n in "${NODES[@]}"; do
  if ! grep -Eq "^[[:space:]]*127\.0\.0\.1([[:space:]].*)?[[:space:]]$n([[:space:]]|\$)" /etc/hosts; then
    echo "127.0.0.1 $n" >> /etc/hosts
  fi
done

# -------------------------------------------------------------------- munge
munge_ok() { munge -n | unmunge; }
if munge_ok >/dev/null 2>&1; then
  log "munge already running"
else
  if [[ ! -s /etc/munge/munge.key ]]; then
    mkdir -p /etc/munge
    if command -v mungekey >/dev/null; then
      mungekey --create --keyfile=/etc/munge/munge.key
    else
      create-munge-key -f
    fi
  fi
  # munged refuses to start unless its dirs are owned by munge and not
  # group/world-writable; /run is a tmpfs on most hosts, so recreate it.
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /etc/munge /etc/munge/munge.key /run/munge /var/log/munge /var/lib/munge
  chmod 700 /etc/munge /var/log/munge
  chmod 711 /var/lib/munge
  chmod 755 /run/munge
  chmod 400 /etc/munge/munge.key
  # --force: tolerate a stale socket/lock left by a munged that was killed.
  runuser -u munge -- munged --force
  : > "$RUN/munged.started-by-up"   # down.sh only stops a munged we started
  wait_for "munge" /var/log/munge/munged.log /run/munge/munged.pid munged -- munge_ok
  log "munged started"
fi

# ------------------------------------------------------------------ mariadb
db_ping() { mysqladmin --no-defaults --socket="$DB_SOCK" -u root ping; }
if pid_alive "$DB_PID" mariadbd; then
  log "mariadb already running"
else
  if [[ ! -d $DB_DIR/data/mysql ]]; then
    log "initialising MariaDB datadir $DB_DIR/data"
    # root@localhost authenticates via the unix socket (we are root); no password to manage.
    mariadb-install-db --no-defaults --user=mysql --datadir="$DB_DIR/data" \
      --auth-root-authentication-method=socket --skip-test-db \
      > "$LOG/mariadb-install-db.log" 2>&1 ||
      { show_log "$LOG/mariadb-install-db.log"; die "mariadb-install-db failed"; }
  fi
  # --no-defaults: ignore /etc/mysql (system instance's port/socket/datadir).
  # No --log-error: mariadbd runs as mysql and can't open files in root's
  # $LOG; without it, it logs to stderr, which we redirect there.
  # setsid -f: detach fully so CI's shell doesn't wait on / kill it.
  setsid -f mariadbd --no-defaults --user=mysql \
    --datadir="$DB_DIR/data" --socket="$DB_SOCK" --pid-file="$DB_PID" \
    --port="$DB_PORT" --bind-address=127.0.0.1 --skip-name-resolve \
    --innodb-lock-wait-timeout=900 \
    < /dev/null >> "$LOG/mariadb.log" 2>&1
  wait_for "mariadb" "$LOG/mariadb.log" "$DB_PID" mariadbd -- db_ping
  log "mariadb started (127.0.0.1:$DB_PORT)"
fi
# (Re)assert the slurmdbd DB user every time: cheap, and it keeps the password
# in sync with slurmdbd.conf even if dbpass was regenerated. With
# --skip-name-resolve a TCP login from 127.0.0.1 matches only 'slurm'@'127.0.0.1'.
mariadb --no-defaults --socket="$DB_SOCK" -u root <<SQL || die "could not create the slurm DB user"
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
SQL

# ----------------------------------------------------------------- slurmdbd
# slurmctld must find slurmdbd up, or it starts without accounting and
# queues records; so slurmdbd (and the cluster row) come first.
dbd_ok() { port_open "$DBD_PORT" && sacctmgr -n -P show cluster format=cluster; }
if pid_alive "$RUN/slurmdbd.pid" slurmdbd; then
  log "slurmdbd already running"
else
  slurmdbd   # daemonises; finds slurmdbd.conf next to $SLURM_CONF
  wait_for "slurmdbd" "$LOG/slurmdbd.log" "$RUN/slurmdbd.pid" slurmdbd -- dbd_ok
  log "slurmdbd started (port $DBD_PORT)"
fi
if ! sacctmgr -n -P show cluster format=cluster | grep -qx slurmtrain; then
  # Also creates the root account and root user association.
  sacctmgr -i add cluster slurmtrain >/dev/null
  log "registered cluster slurmtrain in accounting"
fi

# ---------------------------------------------------------------- slurmctld
ctld_ok() { scontrol ping | grep -q 'is UP'; }
if pid_alive "$RUN/slurmctld.pid" slurmctld; then
  log "slurmctld already running"
  if [[ $CHANGED == 1 ]]; then
    # A restart, not `scontrol reconfigure`: older slurmctlds can't add nodes (the third node) on reconfigure.
    log "config changed: restarting slurmctld"
    scontrol shutdown slurmctld >/dev/null 2>&1 || true
    for _ in $(seq 100); do pid_alive "$RUN/slurmctld.pid" slurmctld || break; sleep 0.1; done
    slurmctld -i
    wait_for "slurmctld" "$LOG/slurmctld.log" "$RUN/slurmctld.pid" slurmctld -- ctld_ok
  fi
else
  # -i: a damaged state file from an earlier crash shouldn't block the tests.
  slurmctld -i
  wait_for "slurmctld" "$LOG/slurmctld.log" "$RUN/slurmctld.pid" slurmctld -- ctld_ok
  log "slurmctld started (port $CTLD_PORT)"
fi

# ------------------------------------------------------------------- slurmd
for n in "${NODES[@]}"; do
  if pid_alive "$RUN/slurmd-$n.pid" slurmd; then
    log "slurmd $n already running"
  else
    slurmd -N "$n"
    log "slurmd $n started (port ${NODE_PORT[$n]})"
  fi
done

# Wait until both nodes are usable. idle/mix/alloc all count (up.sh may be
# re-run while jobs are running). A node restored as down/drain from saved
# state gets resumed; "*" suffix = not responding yet, so just keep waiting.
nodes_ok() {
  local out n st ok=0
  out=$(sinfo -h -N -o '%N %t') || return 1
  for n in "${NODES[@]}"; do
    st=$(awk -v n="$n" '$1 == n {print $2; exit}' <<< "$out")
    case $st in
      idle|mix|alloc|comp) ok=$((ok + 1)) ;;
      down|drain|drng|fail|failg)
        scontrol update nodename="$n" state=resume >/dev/null 2>&1 || true ;;
      inval)
        # Config disagrees with what slurmd found (e.g. CPUs); waiting won't help.
        echo "up.sh: ERROR: node $n is INVALID: $(scontrol show node "$n" | grep -o 'Reason=.*')" >&2
        show_log "$LOG/slurmd-$n.log"
        exit 1 ;;
    esac
  done
  ((ok == ${#NODES[@]}))
}
deadline=$((SECONDS + TIMEOUT))
until nodes_ok; do
  for n in "${NODES[@]}"; do
    if ! pid_alive "$RUN/slurmd-$n.pid" slurmd && ((SECONDS > deadline - TIMEOUT + 5)); then
      show_log "$LOG/slurmd-$n.log"
      die "slurmd $n is not running"
    fi
  done
  if ((SECONDS >= deadline)); then
    sinfo -N -l >&2 || true
    for n in "${NODES[@]}"; do show_log "$LOG/slurmd-$n.log"; done
    show_log "$LOG/slurmctld.log"
    die "nodes not idle after ${TIMEOUT}s"
  fi
  sleep 0.5
done

echo
sinfo -N -o '%N %P %t %c %m'
echo
log "SLURM test cluster 'slurmtrain' is up (state in $STATE)"
echo "export SLURM_CONF=$ETC/slurm.conf"
