#!/bin/sh
# Container entrypoint: `serve` (API + gateway), `ray-head`, `ray-worker`, or any command.
#
# Checks what a read-only root filesystem needs before starting: the data directory and
# /tmp must be writable (the data volume and a tmpfs). Secrets are never printed.
set -eu

data="${RADSERVE_DATA_DIR:-/data}"
mkdir -p "${HOME:-/tmp/radserve-home}" 2>/dev/null || true

need_writable() {
    if ! ( : > "$1/.radserve-write-check" ) 2>/dev/null; then
        echo "docker-entrypoint: $1 is not writable by uid $(id -u); mount a volume" \
             "there owned by that user (the root filesystem is read-only)" >&2
        exit 64
    fi
    rm -f "$1/.radserve-write-check"
}

if [ "$(id -u)" = "0" ] && [ "${ENTRYPOINT_ALLOW_ROOT:-0}" != "1" ]; then
    echo "docker-entrypoint: refusing to run as root; run as the image's user 10001" >&2
    exit 64
fi

mode="${1:-serve}"
[ $# -gt 0 ] && shift
case "$mode" in
    serve)
        need_writable "$data"
        need_writable "${TMPDIR:-/tmp}"
        exec radserve serve --data-dir "$data" "$@"
        ;;
    ray-head)
        need_writable "${TMPDIR:-/tmp}"
        # the head schedules; workers (and the API replicas' drivers) bring the devices
        exec ray start --head --block --port="${RAY_PORT:-6379}" \
            --num-cpus="${RAY_HEAD_NUM_CPUS:-0}" --include-dashboard=false \
            --disable-usage-stats "$@"
        ;;
    ray-worker)
        need_writable "${TMPDIR:-/tmp}"
        : "${RAY_HEAD_ADDRESS:?set RAY_HEAD_ADDRESS (HOST:PORT of the Ray head)}"
        exec ray start --address="$RAY_HEAD_ADDRESS" --block --disable-usage-stats "$@"
        ;;
    *)
        exec "$mode" "$@"
        ;;
esac
