#!/usr/bin/env bash
# Bring up a local "login node" for the remote tests: an OpenSSH server on 127.0.0.1:$PORT, in front of the local
# SLURM cluster (scripts/slurm/up.sh), with everything of its own under $SLURMTRAIN_SSHD_DIR
# (default /var/tmp/slurmtrain-sshd):
#
#   etc/sshd_config, etc/ssh_host_ed25519_key   its config and host key (never the system's /etc/ssh)
#   etc/authorized_keys                          the one key allowed in: client/id_ed25519, made here for the tests
#   client/id_ed25519, client/known_hosts        the test key and the host key as an ssh client must know it
#   client/ssh_config                            `ssh -F client/ssh_config slurmtrain-sshd` logs in (BatchMode)
#   env.sh                                       what a login needs to run slurmtrain and sbatch (a remote's setup)
#   log/sshd.log                                 LogLevel VERBOSE: one "Accepted publickey" line per authentication
#
# The user who logs in is the one running this script (SLURMTRAIN_SSHD_USER to pick another), with the test key
# only: the user's own ~/.ssh keys and authorized_keys are never read or written. Idempotent: a live sshd (pid file)
# is left alone and re-checked.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
STATE=${SLURMTRAIN_SSHD_DIR:-/var/tmp/slurmtrain-sshd}
PORT=${SLURMTRAIN_SSHD_PORT:-16022}
TIMEOUT=${SLURMTRAIN_SSHD_TIMEOUT:-30}
LOGIN_USER=${SLURMTRAIN_SSHD_USER:-$(id -un)}
PYTHON=${PYTHON:-python3}
SLURM_CONF_PATH=${SLURMTRAIN_SLURM_DIR:-/var/tmp/slurmtrain-slurm}/etc/slurm.conf

ETC=$STATE/etc
CLIENT=$STATE/client
RUN=$STATE/run
LOG=$STATE/log

log() { echo "up.sh: $*"; }
die() { echo "up.sh: ERROR: $*" >&2; [[ -f $LOG/sshd.log ]] && tail -n 20 "$LOG/sshd.log" >&2; exit 1; }

[[ $EUID -eq 0 ]] || die "must run as root (sshd switches to the logged-in user)"
for b in /usr/sbin/sshd ssh ssh-keygen rsync; do
  command -v "$b" >/dev/null || die "$b not found; run scripts/sshd/install.sh first"
done

mkdir -p "$ETC" "$CLIENT" "$RUN" "$LOG" "$STATE/work" /run/sshd
chmod 755 "$STATE" /run/sshd
chmod 700 "$ETC" "$CLIENT"
chown "$LOGIN_USER" "$STATE/work" "$CLIENT"

[[ -s $ETC/ssh_host_ed25519_key ]] || ssh-keygen -q -t ed25519 -N '' -C slurmtrain-sshd-host -f "$ETC/ssh_host_ed25519_key"
[[ -s $CLIENT/id_ed25519 ]] || ssh-keygen -q -t ed25519 -N '' -C slurmtrain-sshd-test -f "$CLIENT/id_ed25519"
chown "$LOGIN_USER" "$CLIENT/id_ed25519" "$CLIENT/id_ed25519.pub"
cp "$CLIENT/id_ed25519.pub" "$ETC/authorized_keys"
chmod 644 "$ETC/authorized_keys"
echo "[127.0.0.1]:$PORT $(cut -d' ' -f1,2 "$ETC/ssh_host_ed25519_key.pub")" > "$CLIENT/known_hosts"

cat > "$ETC/sshd_config" <<CONF
# Written by scripts/sshd/up.sh: the remote tests' login node, nothing else.
Port $PORT
ListenAddress 127.0.0.1
HostKey $ETC/ssh_host_ed25519_key
PidFile $RUN/sshd.pid
AuthorizedKeysFile $ETC/authorized_keys
AllowUsers $LOGIN_USER
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
# The state dir sits in /var/tmp (world-writable): its keys are checked by their own modes above.
StrictModes no
PermitUserEnvironment no
LogLevel VERBOSE
# A ControlMaster connection carries many sessions at once (a sweep's status, an rsync, a command).
MaxSessions 64
Subsystem sftp internal-sftp
CONF

cat > "$CLIENT/ssh_config" <<CONF
# Written by scripts/sshd/up.sh: \`ssh -F $CLIENT/ssh_config slurmtrain-sshd\` logs in with the test key only.
Host slurmtrain-sshd
  HostName 127.0.0.1
  Port $PORT
  User $LOGIN_USER
  IdentityFile $CLIENT/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile $CLIENT/known_hosts
  StrictHostKeyChecking yes
  BatchMode yes
CONF
chown "$LOGIN_USER" "$CLIENT/ssh_config" "$CLIENT/known_hosts"

# A login's environment is sshd's bare one: this puts the python that has slurmtrain (this checkout first, as
# PYTHONPATH) and the local cluster's slurm.conf in it. conf/remote/local_sshd.yaml sources it as its setup.
py_bin=$(dirname "$("$PYTHON" -c 'import sys; print(sys.executable)')")
cat > "$STATE/env.sh" <<ENV
# Written by scripts/sshd/up.sh ($REPO)
export PATH="$py_bin:\$PATH"
export PYTHONPATH="$REPO\${PYTHONPATH:+:\$PYTHONPATH}"
export SLURM_CONF="$SLURM_CONF_PATH"
ENV
chmod 644 "$STATE/env.sh"

/usr/sbin/sshd -t -f "$ETC/sshd_config" || die "sshd rejects $ETC/sshd_config"

source "$(dirname "${BASH_SOURCE[0]}")/../pidfile.sh"
if pid=$(pid_of "$RUN/sshd.pid" sshd); then
  # Re-read the config written above (SIGHUP: sshd re-execs itself; live connections stay up).
  kill -HUP "$pid"
  log "sshd already running: config reloaded"
else
  /usr/sbin/sshd -f "$ETC/sshd_config" -E "$LOG/sshd.log"
  log "sshd started (127.0.0.1:$PORT)"
fi

login_ok() { runuser -u "$LOGIN_USER" -- ssh -F "$CLIENT/ssh_config" -o ControlMaster=no -o ControlPath=none slurmtrain-sshd true; }
deadline=$((SECONDS + TIMEOUT))
until login_ok >/dev/null 2>&1; do
  ((SECONDS < deadline)) || { login_ok || true; die "no login through 127.0.0.1:$PORT after ${TIMEOUT}s"; }
  sleep 0.5
done
log "login node is up: ssh -F $CLIENT/ssh_config slurmtrain-sshd (state in $STATE)"
