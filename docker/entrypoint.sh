#!/bin/sh
# swarmnode container entrypoint. tini (PID 1) starts this script; each role ends in
# `exec`, so the swarmnode process receives tini's forwarded SIGTERM directly and
# tini reaps p2pd and the short-lived identity-check daemon when they exit.
#
# Roles (the container's command):
#   node [ARGS...]        `swarmnode run --home $SWARMNODE_HOME ARGS...` (initializes the home first;
#                         waits for the peers file if swarm.peers_file is set)
#   bootstrap [ARGS...]   `swarmnode bootstrap` listening on $SWARMNODE_BOOTSTRAP_LISTEN, announcing
#                         $SWARMNODE_BOOTSTRAP_ANNOUNCE, /healthz on 127.0.0.1:$SWARMNODE_BOOTSTRAP_HTTP_PORT
#   prepare-model         warm-start the built-in tiny model once into $SWARMNODE_MODELS and point
#                         $SWARMNODE_MODELS/current at it (nodes then share one base model)
#   anything else         run as a command (e.g. `swarmnode status --home /data`)
#
# Lists (listen/announce) are space-separated. Settings that are not swarmnode config keys use
# single-underscore names (SWARMNODE_BOOTSTRAP_LISTEN): the config reads every SWARMNODE_X__Y.
set -eu

: "${SWARMNODE_HOME:=/data}"
: "${SWARMNODE_MODELS:=/models}"
: "${SWARMNODE_PEERS_WAIT:=120}"
: "${SWARMNODE_BOOTSTRAP_LISTEN:=/ip4/0.0.0.0/tcp/31337}"
: "${SWARMNODE_BOOTSTRAP_ANNOUNCE:=}"
: "${SWARMNODE_BOOTSTRAP_HTTP_PORT:=8700}"
: "${SWARMNODE_WARM_START_SEED:=0}"

say() {
    printf 'swarmnode-entrypoint: %s\n' "$*" >&2
}

wait_for_peers_file() {
    # A node reads swarm.peers_file once at start: wait for the bootstrap to publish it
    # (compose also orders the start on the bootstrap's health check).
    file="${SWARMNODE_SWARM__PEERS_FILE:-}"
    [ -n "$file" ] || return 0
    waited=0
    while [ ! -s "$file" ]; do
        if [ "$waited" -ge "$SWARMNODE_PEERS_WAIT" ]; then
            say "peers file $file still missing after ${SWARMNODE_PEERS_WAIT} s; starting anyway"
            return 0
        fi
        sleep 1
        waited=$((waited + 1))
    done
}

role="${1:-node}"
if [ "$#" -gt 0 ]; then shift; fi

case "$role" in
    node)
        if [ ! -f "$SWARMNODE_HOME/swarmnode.toml" ]; then
            swarmnode init --home "$SWARMNODE_HOME"
        fi
        wait_for_peers_file
        exec swarmnode run --home "$SWARMNODE_HOME" "$@"
        ;;
    bootstrap)
        # Append our flags to the caller's (argparse does not mind the order); POSIX sh has no arrays.
        for maddr in $SWARMNODE_BOOTSTRAP_LISTEN; do
            set -- "$@" --listen "$maddr"
        done
        for maddr in $SWARMNODE_BOOTSTRAP_ANNOUNCE; do
            set -- "$@" --announce "$maddr"
        done
        set -- "$@" --home "$SWARMNODE_HOME" --http-host 127.0.0.1 --http-port "$SWARMNODE_BOOTSTRAP_HTTP_PORT"
        exec swarmnode bootstrap "$@"
        ;;
    prepare-model)
        mkdir -p "$SWARMNODE_MODELS"
        path=$(python -c '
import sys
from pathlib import Path

from swarmnode.policy.warmstart import warm_start
from swarmnode.tasks import default_mixture

root, seed = Path(sys.argv[1]), int(sys.argv[2])
path = warm_start(root, default_mixture(seed), seed, progress=lambda line: print(line, file=sys.stderr))
print(path.relative_to(root))
' "$SWARMNODE_MODELS" "$SWARMNODE_WARM_START_SEED")
        # Relative link: it stays valid wherever the volume is mounted.
        ln -sfn "$path" "$SWARMNODE_MODELS/current"
        say "model ready: $SWARMNODE_MODELS/current -> $path"
        ;;
    *)
        exec "$role" "$@"
        ;;
esac
