# Sourced by bench/setup_*.sh: a virtual environment of its own for one engine, pinned.
#
#     engine_venv TAG VENV CONSTRAINTS PIN...    # sets ENGINE_VENV_READY=1 if reused
#     ... smoke-test "$VENV/bin/python" ...
#     engine_venv_done                           # stamps the venv with its pins
#
# Idempotent: a venv stamped with the same pins is reused as it is. The base
# interpreter ($PYTHON) defaults to the one interlock's venv (.venv) was made from, so
# every engine runs on the same CPython build. CONSTRAINTS (a pip freeze of a working
# setup) pins every transitive dependency too, when the file exists.

engine_venv() {
    local tag=$1 venv=$2 constraints=$3
    shift 3
    local root
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    if [[ -z "${PYTHON:-}" ]]; then
        if [[ -x "$root/.venv/bin/python" ]]; then
            PYTHON=$("$root/.venv/bin/python" -c 'import sys; print(sys._base_executable)')
        elif command -v python3.11 >/dev/null; then
            PYTHON=python3.11
        else
            PYTHON=python3
        fi
    fi
    _engine_want="$*"
    _engine_stamp="$venv/.bench-pins"
    ENGINE_VENV_READY=0
    if [[ -x "$venv/bin/python" && -f "$_engine_stamp" \
          && "$(cat "$_engine_stamp")" == "$_engine_want" ]]; then
        echo "$tag: $venv already has $_engine_want" >&2
        ENGINE_VENV_READY=1
        return 0
    fi
    echo "$tag: creating $venv with $PYTHON" >&2
    rm -rf "$venv"
    "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
    local args=(--quiet --disable-pip-version-check "$@")
    if [[ -f "$constraints" ]]; then
        args+=(--constraint "$constraints")
    fi
    "$venv/bin/python" -m pip install "${args[@]}"
}

engine_venv_done() {
    echo "$_engine_want" > "$_engine_stamp"
}
