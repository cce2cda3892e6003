# local-daemons.sh - what slurm-local.sh and sge-local.sh share: logging, pid bookkeeping of the daemons they start
# (a pid with its kernel start time, so that `stop` never signals a reused pid), and a non-interactive apt install
# that keeps package scripts from starting daemons nobody tracks.
# Sourced, with NAME (the log prefix), BASE (the state directory), PKGS (the packages) and PROBE_PKG (a package
# whose candidate version tells whether apt's lists are current) set by the script.

log() { printf '[%s] %s\n' "$NAME" "$*"; }
die() { printf '[%s] ERROR: %s\n' "$NAME" "$*" >&2; exit 1; }
now() { echo "$EPOCHREALTIME"; }
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}'; }
need_root() { [ "$(id -u)" = 0 ] || die "must run as root"; }

# ---------------------------------------------------------------- pid bookkeeping
proc_stat() { # "STATE STARTTIME" of a pid (fields 3 and 22 of /proc/PID/stat)
    local s
    s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    s=${s##*) }                       # drop "pid (comm) "
    # shellcheck disable=SC2086
    set -- $s                         # now $1 = state (field 3) ... start time (field 22) = $20
    echo "$1 ${20}"
}
starttime() { # kernel start time (clock ticks since boot) of a live (non-zombie) pid
    local st
    st=$(proc_stat "$1") || return 1
    case "${st%% *}" in Z|X|x) return 1 ;; esac   # exited, not yet reaped by PID 1
    echo "${st#* }"
}
pidfile() { echo "$BASE/pids/$1.pid"; }
# prints the recorded pid of daemon $1 if that exact process is still alive, else fails
our_pid() {
    local f pid st cur
    f=$(pidfile "$1")
    [ -s "$f" ] || return 1
    read -r pid st < "$f" || return 1
    [ -n "${pid:-}" ] || return 1
    cur=$(starttime "$pid") || return 1
    [ "$cur" = "$st" ] || return 1
    echo "$pid"
}

# ---------------------------------------------------------------- install
TMP_POLICY=""
pkg_installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]; }
# install_pkgs [PRESEED_FUNCTION]: install what PKGS lacks; the function, when given, answers debconf first.
install_pkgs() {
    local missing=() p t0
    for p in "${PKGS[@]}"; do pkg_installed "$p" || missing+=("$p"); done
    [ ${#missing[@]} -eq 0 ] && { log "packages already installed: ${PKGS[*]}"; return 0; }
    t0=$(now)
    log "installing: ${missing[*]}"
    # Keep package postinst scripts from starting daemons we would not track
    # (Docker-style images already ship a policy-rc.d that does this).
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        TMP_POLICY=/usr/sbin/policy-rc.d
        printf '#!/bin/sh\n# temporary, created by %s\nexit 101\n' "$NAME" > "$TMP_POLICY"
        chmod 755 "$TMP_POLICY"
        trap 'rm -f "$TMP_POLICY"' EXIT
    fi
    if [ -n "${1:-}" ]; then "$1"; fi
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-cache policy "$PROBE_PKG" 2>/dev/null | grep 'Candidate: [0-9]' >/dev/null; then
        apt-get update -q
    fi
    if ! apt-get -y -q install --no-install-recommends "${missing[@]}"; then
        apt-get update -q
        apt-get -y -q install --no-install-recommends "${missing[@]}"
    fi
    if [ -n "$TMP_POLICY" ]; then rm -f "$TMP_POLICY"; TMP_POLICY=""; trap - EXIT; fi
    log "install took $(since "$t0")s"
}
