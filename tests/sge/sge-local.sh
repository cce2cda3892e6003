#!/usr/bin/env bash
# sge-local.sh - install and run a real one-node Grid Engine on localhost (Debian 12 "bookworm":
# gridengine-master / gridengine-exec / gridengine-client 8.1.9, Son of Grid Engine), for integration tests.
#
# Usage: sge-local.sh start | stop | status | wait JOBID [TIMEOUT_S]
#
# Must run as root. The packages are installed non-interactively (debconf answers preseeded, package scripts
# kept from starting daemons); the daemons are started directly (no systemd needed), and their PIDs (+ kernel
# start time, against PID reuse) are recorded under $SGE_LOCAL_DIR/pids: `stop` only ever stops those.
# The cluster: this host as master, submit and execution host, one queue all.q with one slot per CPU, jobs of
# any user (root included), a scheduler that runs every second.
#
# Clients need: export SGE_ROOT=/var/lib/gridengine SGE_CELL=default (`start` prints it).
#
# Environment knobs (all optional):
#   SGE_LOCAL_DIR      pid/log dir                           (default /tmp/sge-local)
#   SGE_LOCAL_SLOTS    slots of all.q                        (default: nproc)
#   SGE_LOCAL_TIMEOUT  seconds to wait for readiness         (default 60)
set -euo pipefail
# (with pipefail, never `cmd | grep -q`: grep exiting early can SIGPIPE cmd and fail the pipe)

BASE=${SGE_LOCAL_DIR:-/tmp/sge-local}
TIMEOUT=${SGE_LOCAL_TIMEOUT:-60}
SLOTS=${SGE_LOCAL_SLOTS:-$(nproc)}
PKGS=(gridengine-master gridengine-exec gridengine-client)
export SGE_ROOT=/var/lib/gridengine SGE_CELL=default
export PATH="/usr/sbin:/usr/bin:/sbin:/bin:$PATH"
COMMON=$SGE_ROOT/$SGE_CELL/common
UTILS=/usr/lib/gridengine
SPOOL=/var/spool/gridengine
STOPPED=()

NAME=sge-local
PROBE_PKG=gridengine-master
# shellcheck source=../local-daemons.sh
. "$(dirname "${BASH_SOURCE[0]}")/../local-daemons.sh"

# record NAME PIDFILE: the daemon forked itself into the background and wrote its pid there
record() {
    local name=$1 file=$2 pid="" st=""
    for _ in $(seq 1 $((TIMEOUT * 10))); do
        [ -s "$file" ] && pid=$(tr -d ' \n' < "$file") && st=$(starttime "$pid") && break
        sleep 0.1
    done
    [ -n "$st" ] || die "$name did not start (no live pid in $file)"
    mkdir -p "$BASE/pids"
    echo "$pid $st" > "$(pidfile "$name")"
    log "started $name pid=$pid"
}

# ---------------------------------------------------------------- install
# The cluster the package creates: cell "default", configured by the package (spool, complexes, users).
preseed() {
    debconf-set-selections <<EOF
gridengine-common shared/gridenginecell string default
gridengine-common shared/gridengineconfig boolean true
gridengine-common shared/gridenginemaster string $(hostname)
EOF
}

# ---------------------------------------------------------------- host names
# Grid Engine compares the name a client's address resolves to with the name the client gives itself; where the
# two differ (this host's name maps to 127.0.0.1 = "localhost"), host_aliases makes them one host.
host_names() {
    local own addr canonical
    rm -f "$COMMON/host_aliases"  # the names as resolved, not as an earlier start aliased them
    own=$("$UTILS/gethostname" -aname)
    addr=$(getent ahostsv4 "$own" | awk 'NR == 1 {print $1}')
    canonical=$("$UTILS/gethostbyaddr" -aname "${addr:-127.0.0.1}" 2>/dev/null || echo "$own")
    HOST=${canonical:-$own}
    [ "$HOST" = "$own" ] || echo "$HOST $own" > "$COMMON/host_aliases"
    echo "$HOST" > "$COMMON/act_qmaster"
}

# ---------------------------------------------------------------- configuration (idempotent)
qmaster_up() { qconf -sh >/dev/null 2>&1; }
configure() {
    local dir="$BASE/conf"
    mkdir -p "$dir"
    { qconf -ss 2>/dev/null || true; } | grep -x "$HOST" >/dev/null || qconf -as "$HOST" >/dev/null
    if ! qconf -se "$HOST" >/dev/null 2>&1; then
        printf 'hostname %s\nload_scaling NONE\ncomplex_values NONE\nuser_lists NONE\nxuser_lists NONE\nprojects NONE\nxprojects NONE\nusage_scaling NONE\nreport_variables NONE\n' \
            "$HOST" > "$dir/exechost"
        qconf -Ae "$dir/exechost" >/dev/null
    fi
    if ! qconf -shgrp @allhosts >/dev/null 2>&1; then
        printf 'group_name @allhosts\nhostlist %s\n' "$HOST" > "$dir/hostgroup"
        qconf -Ahgrp "$dir/hostgroup" >/dev/null
    fi
    if ! qconf -sq all.q >/dev/null 2>&1; then
        qconf -sq | sed -e 's/^qname .*/qname all.q/' -e 's/^hostlist .*/hostlist @allhosts/' \
            -e "s/^slots .*/slots $SLOTS/" -e 's|^shell .*|shell /bin/bash|' -e 's/^pe_list .*/pe_list NONE/' \
            -e 's/^load_thresholds .*/load_thresholds NONE/' > "$dir/queue"
        qconf -Aq "$dir/queue" >/dev/null
    fi
    # Jobs of root too (the default refuses uids below 1000).
    # Accounting records (qacct) written every second rather than every 15.
    qconf -sconf global | sed -e '/^#/d' -e 's/^min_uid .*/min_uid 0/' -e 's/^min_gid .*/min_gid 0/' \
        -e 's/flush_time=[0-9:]*/flush_time=00:00:01/' > "$dir/global"
    qconf -Mconf "$dir/global" >/dev/null
    # Schedule every second (default 15 s) so that dependent jobs start right after the ones they wait for.
    qconf -ssconf | sed -e 's/^schedule_interval .*/schedule_interval 0:0:1/' \
        -e 's/^flush_submit_sec .*/flush_submit_sec 1/' -e 's/^flush_finish_sec .*/flush_finish_sec 1/' \
        > "$dir/scheduler"
    qconf -Msconf "$dir/scheduler" >/dev/null
}
queue_ready() { # all.q@HOST is listed with no state flags (a = alarm, u = unknown, d = disabled, ...)
    local line
    line=$({ qstat -f -q "all.q@$HOST" 2>/dev/null || true; } | awk -v q="all.q@$HOST" '$1 == q')
    [ -n "$line" ] && [ "$(awk '{print NF}' <<<"$line")" -eq 5 ]
}

do_start() {
    need_root
    local t0=$SECONDS
    install_pkgs preseed
    host_names
    mkdir -p /var/run/gridengine "$BASE/pids"
    chown sgeadmin:sgeadmin /var/run/gridengine "$SPOOL/qmaster" "$SPOOL/execd" 2>/dev/null || true
    if our_pid qmaster >/dev/null; then
        log "sge_qmaster already running (ours)"
    else
        qmaster_up && die "a qmaster not started by this script answers on port 6444"
        rm -f "$SPOOL/qmaster/qmaster.pid"
        /usr/sbin/sge_qmaster
        record qmaster "$SPOOL/qmaster/qmaster.pid"
        for _ in $(seq 1 $((TIMEOUT * 5))); do qmaster_up && break; sleep 0.2; done
        qmaster_up || { tail -n 20 "$SPOOL/qmaster/messages" >&2 || true; die "sge_qmaster did not come up"; }
    fi
    configure
    if our_pid execd >/dev/null; then
        log "sge_execd already running (ours)"
    else
        rm -f "$SPOOL/execd/$HOST/execd.pid"
        /usr/sbin/sge_execd
        record execd "$SPOOL/execd/$HOST/execd.pid"
    fi
    for _ in $(seq 1 $((TIMEOUT * 5))); do queue_ready && break; sleep 0.2; done
    queue_ready || { qstat -f >&2 || true; die "queue all.q@$HOST did not become ready"; }
    qstat -f
    log "started in $((SECONDS - t0)) s; clients need: export SGE_ROOT=$SGE_ROOT SGE_CELL=$SGE_CELL"
}

stop_daemon() { # NAME HOW...: ask the daemon to exit, wait, then SIGKILL the recorded pid if it did not
    local name=$1 pid st
    shift
    if pid=$(our_pid "$name"); then
        st=$(starttime "$pid") || true
        "$@" >/dev/null 2>&1 || kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 150); do our_pid "$name" >/dev/null || break; sleep 0.2; done
        if our_pid "$name" >/dev/null; then
            log "$name pid=$pid did not exit within 30 s; sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
        STOPPED+=("$pid $st")
        log "stopped $name pid=$pid"
    fi
    rm -f "$(pidfile "$name")"
}

do_stop() {
    need_root
    HOST=$(cat "$COMMON/act_qmaster" 2>/dev/null || hostname)
    if our_pid qmaster >/dev/null && qmaster_up; then
        qdel -u '*' >/dev/null 2>&1 || true
    fi
    stop_daemon execd qconf -ke "$HOST"
    stop_daemon qmaster qconf -km
    local e pid st left
    for _ in $(seq 1 30); do # let PID 1 reap them, so no <defunct> entries of ours are left behind
        left=0
        for e in "${STOPPED[@]}"; do
            read -r pid st <<<"$e"
            [ "$(proc_stat "$pid" 2>/dev/null | cut -d' ' -f2)" = "$st" ] && left=1
        done
        [ "$left" = 0 ] && break
        sleep 0.1
    done
    log "stopped"
}

do_status() {
    local n pid rc=0
    for n in qmaster execd; do
        if pid=$(our_pid "$n"); then echo "$n: running pid=$pid"; else echo "$n: not running (ours)"; rc=3; fi
    done
    if qmaster_up; then qstat -f; else echo "qmaster: not responding"; rc=3; fi
    return $rc
}

# wait JOBID [TIMEOUT_S]: until the job (every array task) has left the queue or sits in the error state (a
# failed job that something holds on: exit 100). Prints the tasks' exit statuses as "exit_status=N xCOUNT"
# (from qacct) or "error_state"; exit 0 when every task exited 0, 1 otherwise, 124 on timeout.
do_wait() {
    local id=${1:?usage: $0 wait JOBID [TIMEOUT_S]} to=${2:-300} t0=$SECONDS state summary
    while :; do
        state=$({ qstat 2>/dev/null || true; } | awk -v id="$id" '$1 == id {print $5}' | sort -u | tr '\n' ' ')
        if [ -z "$state" ]; then break; fi
        # Every task left is in the error state: nothing of this job will run any more.
        if ! tr ' ' '\n' <<<"$state" | grep -v '^$' | grep -v E >/dev/null; then
            echo "error_state ($state)"; return 1
        fi
        if (( SECONDS - t0 >= to )); then echo "timeout: $state"; return 124; fi
        sleep 0.5
    done
    # qacct reads the accounting file, which the execd reports into within a few seconds of the end.
    for _ in $(seq 1 60); do qacct -j "$id" >/dev/null 2>&1 && break; sleep 0.5; done
    summary=$(qacct -j "$id" 2>/dev/null | awk '$1 == "exit_status" {c[$2]++} END {for (k in c) printf "exit_status=%s x%d ", k, c[k]}')
    [ -n "$summary" ] || { echo "job $id: no accounting record"; return 1; }
    echo "$summary"
    [[ "$summary" =~ ^(exit_status=0\ x[0-9]+\ )$ ]]
}

case "${1:-}" in
    start)  do_start ;;
    stop)   do_stop ;;
    status) do_status ;;
    wait)   shift; do_wait "$@" ;;
    *) echo "usage: $0 start|stop|status|wait JOBID [TIMEOUT_S]" >&2; exit 2 ;;
esac
