# shellcheck shell=bash
# Start a throwaway PostgreSQL for the test suite.  SOURCE this file (from .ci/run):
#
#     source .ci/postgres.sh || exit 1
#
# On success it exports INTERLOCK_TEST_POSTGRES=postgresql://postgres@127.0.0.1:PORT/postgres
# and arranges for the server to be stopped (and its files removed) when the shell exits;
# `interlock_pg_stop` stops it earlier.  If INTERLOCK_TEST_POSTGRES is already set, nothing
# is started.  Installs PostgreSQL with apt when it is missing (needs root).  As root the
# server runs as the `postgres` user (it refuses to run as root).  Tuned for speed, not
# durability: fsync and synchronous_commit are off -- never point it at data you keep.
# INTERLOCK_PG_DURABLE=1 keeps the server's defaults (fsync, synchronous_commit on): what
# the benchmark measures (bench/README.md, S8).
# Returns non-zero (never exits the caller's shell) on failure.

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    echo "postgres.sh: source this file (source .ci/postgres.sh), do not run it" >&2
    exit 2
fi

_interlock_pg_start() {
    if [[ -n "${INTERLOCK_TEST_POSTGRES:-}" ]]; then
        echo "postgres.sh: INTERLOCK_TEST_POSTGRES already set; not starting a server" >&2
        return 0
    fi

    local bindir
    bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1) || true
    if [[ -z "$bindir" || ! -x "$bindir/initdb" ]] && command -v initdb >/dev/null; then
        bindir=$(dirname "$(command -v initdb)")  # a server on PATH (e.g. /usr/local/bin)
    fi
    if [[ -z "$bindir" || ! -x "$bindir/initdb" ]]; then
        if [[ $EUID -ne 0 ]]; then
            echo "postgres.sh: PostgreSQL is not installed and we are not root to apt-get it" >&2
            return 1
        fi
        echo "postgres.sh: installing PostgreSQL with apt-get" >&2
        apt-get update -qq >&2 || return 1
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2 || return 1
        bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1) || true
        if [[ -z "$bindir" || ! -x "$bindir/initdb" ]]; then
            echo "postgres.sh: apt-get installed postgresql but no initdb found" >&2
            return 1
        fi
    fi

    local -a as_pg=()
    if [[ $EUID -eq 0 ]]; then
        as_pg=(runuser -u postgres --)
    fi

    local dir
    dir=$(mktemp -d "${TMPDIR:-/tmp}/interlock-pg.XXXXXX") || return 1
    if [[ $EUID -eq 0 ]]; then
        chown postgres:postgres "$dir" || return 1
    fi
    _INTERLOCK_PG_DIR=$dir
    _INTERLOCK_PG_BIN=$bindir

    if ! "${as_pg[@]}" "$bindir/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 \
            --locale=C --no-sync >"$dir/initdb.log" 2>&1; then
        echo "postgres.sh: initdb failed:" >&2
        cat "$dir/initdb.log" >&2
        return 1
    fi

    # A free port: one nobody answers on.  If another process takes it before the server
    # binds, pg_ctl fails and we try the next one.
    local port attempt started="" speed="-c fsync=off -c synchronous_commit=off \
-c full_page_writes=off"
    if [[ "${INTERLOCK_PG_DURABLE:-}" == 1 ]]; then
        speed=""
    fi
    for attempt in 1 2 3 4 5 6 7 8; do
        port=$(( 20000 + (RANDOM % 20000) ))
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            continue  # in use
        fi
        if "${as_pg[@]}" "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
                -o "-p $port -k $dir -c listen_addresses=127.0.0.1 $speed \
-c max_connections=200" \
                start >"$dir/pg_ctl.log" 2>&1; then
            started=1
            break
        fi
        echo "postgres.sh: start on port $port failed (attempt $attempt), retrying" >&2
    done
    if [[ -z "$started" ]]; then
        echo "postgres.sh: could not start PostgreSQL; its log:" >&2
        cat "$dir/pg_ctl.log" "$dir/server.log" >&2 2>/dev/null
        return 1
    fi
    _INTERLOCK_PG_PORT=$port

    # pg_ctl -w already waited for it; make sure TCP on 127.0.0.1 answers too.
    local i
    for i in $(seq 1 100); do
        if "$bindir/pg_isready" -q -h 127.0.0.1 -p "$port" -U postgres; then
            break
        fi
        if [[ $i -eq 100 ]]; then
            echo "postgres.sh: PostgreSQL did not accept connections on 127.0.0.1:$port" >&2
            cat "$dir/server.log" >&2
            return 1
        fi
        sleep 0.1
    done

    export INTERLOCK_TEST_POSTGRES="postgresql://postgres@127.0.0.1:$port/postgres"
    echo "postgres.sh: PostgreSQL $("$bindir/postgres" --version | awk '{print $3}') up," \
         "INTERLOCK_TEST_POSTGRES=$INTERLOCK_TEST_POSTGRES" >&2

    # Stop it when the shell exits, keeping whatever EXIT trap the caller already has.
    local previous=""
    eval "set -- $(trap -p EXIT)"
    previous=${3:-}
    # shellcheck disable=SC2064  # expand $previous now, on purpose
    trap "interlock_pg_stop; ${previous}" EXIT
    return 0
}

interlock_pg_stop() {
    local dir=${_INTERLOCK_PG_DIR:-}
    [[ -n "$dir" && -d "$dir" ]] || return 0
    local -a as_pg=()
    if [[ $EUID -eq 0 ]]; then
        as_pg=(runuser -u postgres --)
    fi
    if [[ -f "$dir/data/postmaster.pid" ]]; then
        "${as_pg[@]}" "$_INTERLOCK_PG_BIN/pg_ctl" -D "$dir/data" -m fast -w -t 30 stop \
            >/dev/null 2>&1 || echo "postgres.sh: pg_ctl stop failed (dir $dir)" >&2
    fi
    rm -rf "$dir"
    if [[ "${INTERLOCK_TEST_POSTGRES:-}" == *":${_INTERLOCK_PG_PORT:-none}/"* ]]; then
        unset INTERLOCK_TEST_POSTGRES
    fi
    _INTERLOCK_PG_DIR=""
    return 0
}

_interlock_pg_start
