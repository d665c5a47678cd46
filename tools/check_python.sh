#!/bin/sh
# Before make builds or uses the virtual environment: the interpreter it is built with is
# Python 3.11 or later, and an existing one still works (runs, is 3.11+, has pip).
#
# Why: with an older python3, `make demo` failed minutes in, deep inside pip ("requires a
# different Python"); and a .venv left by such an attempt, or one whose Python was
# removed or upgraded away, was reused by every later run whatever PYTHON said. A .venv
# radserve made (the default one, or one with its marker) is removed here, with one line,
# and made again; one it did not make is left alone, with one line saying what to do.
#
# usage: check_python.sh PYTHON VENV GOAL   (GOAL: the make goal, for the advice)
set -u
python=$1
venv=$2
goal=${3:-demo}
marker=.made-by-radserve  # written by the Makefile into each venv it makes

version_of() {  # "3.11.7", or nothing when "$1" does not run as a Python
    out=$("$1" -c 'import sys; print("%d.%d.%d" % tuple(sys.version_info[:3]))' 2>/dev/null)
    case $out in
        [0-9]*.[0-9]*.[0-9]*) echo "$out" ;;
    esac
}

recent_enough() {  # "$1" (X.Y.Z) is 3.11 or later
    major=${1%%.*}
    rest=${1#*.}
    minor=${rest%%.*}
    [ "$major" -gt 3 ] || { [ "$major" -eq 3 ] && [ "$minor" -ge 11 ]; }
}

advice() {  # how to point PYTHON at a 3.11+ interpreter, naming one on PATH if any
    for candidate in python3.14 python3.13 python3.12 python3.11; do
        found=$(version_of "$candidate")
        if [ -n "$found" ] && recent_enough "$found"; then
            echo "run: make $goal PYTHON=$candidate (Python $found is installed)"
            return
        fi
    done
    echo "install Python 3.11 or later (with its venv module: apt install python3.11-venv," \
        "dnf install python3.11) and run: make $goal PYTHON=python3.11"
}

found=$(version_of "$python")
if [ -z "$found" ]; then
    if command -v "$python" >/dev/null 2>&1; then
        echo "radserve needs Python 3.11 or later: PYTHON=$python does not run as Python; $(advice)" >&2
    else
        echo "radserve needs Python 3.11 or later: PYTHON=$python was not found; $(advice)" >&2
    fi
    exit 1
fi
if ! recent_enough "$found"; then
    echo "radserve needs Python 3.11 or later, but PYTHON=$python is Python $found; $(advice)" >&2
    exit 1
fi

# the virtual environment, if there is one
[ -e "$venv" ] || [ -L "$venv" ] || exit 0
in_venv=$(version_of "$venv/bin/python")
if [ -z "$in_venv" ]; then
    problem="its bin/python does not run"
elif ! recent_enough "$in_venv"; then
    problem="it was made with Python $in_venv"
elif ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
    problem="it has no pip (a venv whose creation failed half-way)"
else
    exit 0
fi
if [ "$venv" = ".venv" ] || [ -f "$venv/$marker" ]; then
    echo "$venv is not usable ($problem): removing it; it is made again with $python (Python $found)" >&2
    rm -rf "$venv"
    exit 0
fi
echo "VENV=$venv is not usable ($problem), and radserve did not make it: remove it" \
    "(rm -rf $venv) or choose another VENV=, then run make $goal again" >&2
exit 1
