#!/usr/bin/env bash
# A scaled-out orgmem on one machine, without containers, all on 127.0.0.1:
#
#   SeaweedFS (`weed mini`, the S3 service)  <-  gateway-1, gateway-2, ... (`orgmem serve`,
#   one bucket and prefix shared)  <-  nginx (the load balancer clients talk to)
#
# It is the deployment of deploy/compose and deploy/k8s, process for process, so the
# test suite and bench/cluster_bench.py can exercise it end to end.
#
#   deploy/local-cluster.sh start             start what is not running (first start: keys, config)
#   deploy/local-cluster.sh stop              stop everything (the data stays for the next start)
#   deploy/local-cluster.sh status            one line per process; exit 0 only when all are ready
#   deploy/local-cluster.sh env               `export` lines for clients (endpoint and root keys)
#   deploy/local-cluster.sh kill-gateway N    SIGKILL replica N (a crash)
#   deploy/local-cluster.sh stop-gateway N    SIGTERM replica N (a graceful stop)
#   deploy/local-cluster.sh start-gateway N   start replica N again (N: a number or "all")
#   deploy/local-cluster.sh destroy           stop, then delete the state directory
#
# Settings (environment):
#   ORGMEM_CLUSTER_DIR       state directory (default ./orgmem-cluster under the repository)
#   ORGMEM_CLUSTER_BIN       where `orgmem`, `weed` and `python` are (default .venv/bin)
#   ORGMEM_CLUSTER_NGINX     the nginx binary (default: nginx on PATH; `apt-get install nginx`)
#   ORGMEM_CLUSTER_REPLICAS  how many gateways (default 2; at a later start, as many as before)
#   ORGMEM_CLUSTER_LB_PORT, ORGMEM_CLUSTER_GATEWAY_PORTS ("P1 P2"): fixed ports; by default
#                            free ports are picked at the first start and kept in cluster.env
#   ORGMEM_CLUSTER_COMPACT_INTERVAL  the gateways' --compact-interval (default 5 s)
#   ORGMEM_ROOT_ACCESS_KEY / ORGMEM_ROOT_SECRET_KEY: root keys to use at the first start
#                            (default: generated and kept in DIR/secrets/root.env, 0600)
# Deliberately broken settings, for checking start-up errors (start and start-gateway):
#   ORGMEM_CLUSTER_KEK       the gateways' --kek instead of file:DIR/secrets/keyring.json
#   ORGMEM_CLUSTER_UPSTREAM  the gateways' --backend-endpoint instead of the local SeaweedFS
#   ORGMEM_CLUSTER_UPSTREAM_ACCESS_KEY / ORGMEM_CLUSTER_UPSTREAM_SECRET_KEY: the gateways'
#                            upstream credentials instead of the SeaweedFS identity's
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
DIR=${ORGMEM_CLUSTER_DIR:-$REPO/orgmem-cluster}
BIN=${ORGMEM_CLUSTER_BIN:-$REPO/.venv/bin}
NGINX=${ORGMEM_CLUSTER_NGINX:-nginx}
PY="$BIN/python"
REPLICAS=()
BUCKET=orgmem
PREFIX=cluster
READY_TIMEOUT=${ORGMEM_CLUSTER_READY_TIMEOUT:-60}

say() { printf '%s\n' "$*"; }
die() { printf 'local-cluster: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------------------- state

# How many gateways: ORGMEM_CLUSTER_REPLICAS at start, else as many as the last start had.
set_replicas() {
    local count=${1:-2}
    [[ "$count" =~ ^[1-9]$ ]] || die "ORGMEM_CLUSTER_REPLICAS must be 1 to 9, not '$count'"
    REPLICA_COUNT=$count
    mapfile -t REPLICAS < <(seq 1 "$count")
}

mkdirs() {
    mkdir -p "$DIR"
    DIR=$(cd "$DIR" && pwd)
    # keep the state out of git when it sits inside the repository (the default)
    [[ -f "$DIR/.gitignore" ]] || printf '*\n' >"$DIR/.gitignore"
    mkdir -p -m 0700 "$DIR/secrets" "$DIR/seaweedfs"
    mkdir -p "$DIR/seaweedfs/data" "$DIR/seaweedfs/log" "$DIR/nginx/tmp"
    local n
    for n in "${REPLICAS[@]}"; do mkdir -p -m 0700 "$DIR/gateway-$n"; done
}

# Ports: fixed by the environment, else those of the last start, else free ones.
load_ports() {
    local n i=0 given=()
    if [[ -n "${ORGMEM_CLUSTER_GATEWAY_PORTS:-}" ]]; then
        read -r -a given <<<"$ORGMEM_CLUSTER_GATEWAY_PORTS"
    fi
    for n in "${REPLICAS[@]}"; do
        if [[ -n "${given[$i]:-}" ]]; then printf -v "GATEWAY_${n}_PORT" '%s' "${given[$i]}"; fi
        i=$((i + 1))
    done
    if [[ -n "${ORGMEM_CLUSTER_LB_PORT:-}" ]]; then LB_PORT=$ORGMEM_CLUSTER_LB_PORT; fi
    if [[ -z "${S3_PORTS:-}" ]]; then
        # ten for weed mini (its admin gRPC port must be admin port + 10000), then the rest
        S3_PORTS=$("$PY" - <<'EOF'
import socket
socks, ports = [], []
def grab(port=0):
    s = socket.socket(); s.bind(("127.0.0.1", port)); socks.append(s); return s.getsockname()[1]
while len(ports) < 8:
    p = grab()
    if p not in ports: ports.append(p)
while True:
    a = grab()
    if a + 10000 > 65535 or a in ports: continue
    try:
        grab(a + 10000)
    except OSError:
        continue
    ports += [a, a + 10000]; break
print(" ".join(map(str, ports)))
EOF
)
    fi
    local free
    free=$("$PY" -c '
import socket, sys
s = [socket.socket() for _ in range(int(sys.argv[1]))]
for x in s: x.bind(("127.0.0.1", 0))
print(" ".join(str(x.getsockname()[1]) for x in s))' $((REPLICA_COUNT + 1)))
    read -r -a free <<<"$free"
    LB_PORT=${LB_PORT:-${free[0]}}
    i=1
    for n in "${REPLICAS[@]}"; do
        local v="GATEWAY_${n}_PORT"
        [[ -n "${!v:-}" ]] || printf -v "$v" '%s' "${free[$i]}"
        i=$((i + 1))
    done
    read -r S3_PORT _ <<<"$S3_PORTS"
    {
        echo "# written by deploy/local-cluster.sh: ports and endpoints (no secrets)"
        echo "REPLICA_COUNT=$REPLICA_COUNT"
        echo "S3_PORTS=\"$S3_PORTS\""
        echo "S3_PORT=$S3_PORT"
        echo "LB_PORT=$LB_PORT"
        for n in "${REPLICAS[@]}"; do echo "GATEWAY_${n}_PORT=$(gateway_port "$n")"; done
        echo "S3_ENDPOINT=http://127.0.0.1:$S3_PORT"
        echo "LB_ENDPOINT=http://127.0.0.1:$LB_PORT"
        for n in "${REPLICAS[@]}"; do echo "GATEWAY_${n}_ENDPOINT=http://127.0.0.1:$(gateway_port "$n")"; done
        echo "BACKEND=s3://$BUCKET/$PREFIX"
    } >"$DIR/cluster.env"
}

gateway_port() { local v="GATEWAY_$1_PORT"; printf '%s' "${!v}"; }

random_key() {  # LENGTH ALPHABET
    "$PY" -c 'import secrets, sys; n, a = int(sys.argv[1]), sys.argv[2]; print("".join(secrets.choice(a) for _ in range(n)))' "$1" "$2"
}

# Keys are made once and kept, owner-only, under DIR/secrets: the KEK keyring (never
# inside a gateway's data directory), the root keys and the SeaweedFS identity.
ensure_secrets() {
    local s="$DIR/secrets"
    if [[ ! -f "$s/keyring.json" ]]; then
        "$PY" -c 'import sys; from pathlib import Path; from vault.keys import create_keyring; create_keyring(Path(sys.argv[1]))' \
            "$s/keyring.json"
    fi
    if [[ ! -f "$s/root.env" ]]; then
        local ak=${ORGMEM_ROOT_ACCESS_KEY:-} sk=${ORGMEM_ROOT_SECRET_KEY:-}
        if [[ -z "$ak" || -z "$sk" ]]; then
            ak="AKORGMEM$(random_key 12 ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789)"
            sk=$(random_key 40 ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789)
        fi
        (umask 077; printf 'ORGMEM_ROOT_ACCESS_KEY=%s\nORGMEM_ROOT_SECRET_KEY=%s\n' "$ak" "$sk" >"$s/root.env")
    fi
    if [[ ! -f "$s/upstream.env" ]]; then
        local uak usk
        uak="AKSEAWEED$(random_key 11 ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789)"
        usk=$(random_key 40 ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789)
        (umask 077; printf 'UPSTREAM_ACCESS_KEY=%s\nUPSTREAM_SECRET_KEY=%s\n' "$uak" "$usk" >"$s/upstream.env")
    fi
    # shellcheck disable=SC1091
    source "$s/root.env"
    # shellcheck disable=SC1091
    source "$s/upstream.env"
}

# The gateways' shared settings, as the TOML file deploy/k8s keeps in its ConfigMap. Each
# replica adds only its port and data directory on the command line.
write_config() {
    cat >"$DIR/orgmem.toml" <<EOF
# written by deploy/local-cluster.sh; every replica reads it (flags add port and data)
host = "127.0.0.1"
backend = "s3://$BUCKET/$PREFIX"
backend_endpoint = "http://127.0.0.1:$S3_PORT"
kek = "file:$DIR/secrets/keyring.json"
trusted_proxies = "127.0.0.1"
compact_interval = ${ORGMEM_CLUSTER_COMPACT_INTERVAL:-5}
log_level = "info"
EOF
}

# ---------------------------------------------------------------------------- processes

pid_of() { [[ -f "$1" ]] && cat "$1" || true; }

# PIDFILE NAME: the pid when it is alive and still the program we started (pids get reused).
alive() {
    local pid
    pid=$(pid_of "$1")
    [[ -n "$pid" && -r "/proc/$pid/cmdline" ]] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$2" || return 1
    printf '%s' "$pid"
}

# PIDFILE NAME SIGNAL SECONDS: signal the process (its group when it leads one), wait for it
# to go, SIGKILL what is left after SECONDS.
stop_pid() {
    local pid target
    pid=$(alive "$1" "$2") || { rm -f "$1"; return 0; }
    target=$pid
    if [[ "$(ps -o pgid= -p "$pid" | tr -d ' ')" == "$pid" ]]; then target="-$pid"; fi
    kill "-$3" -- "$target" 2>/dev/null || true
    local i
    for ((i = 0; i < $4 * 10; i++)); do
        [[ -d "/proc/$pid" ]] && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null || break
        sleep 0.1
    done
    if [[ -d "/proc/$pid" ]]; then kill -KILL -- "$target" 2>/dev/null || true; fi
    rm -f "$1"
}

# The environment a server starts with: the caller's, minus every ORGMEM_* and AWS_*.
clean_env() {
    local names name
    names=$(compgen -e | grep -E '^(ORGMEM_|AWS_)' || true)
    CLEAN_ENV=(env)
    for name in $names; do CLEAN_ENV+=(-u "$name"); done
}

http_status() { curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$1" 2>/dev/null || true; }

# ---------------------------------------------------------------------------- SeaweedFS

seaweed_pidfile() { printf '%s' "$DIR/seaweedfs/weed.pid"; }

start_seaweed() {
    if alive "$(seaweed_pidfile)" weed >/dev/null; then return 0; fi
    local d="$DIR/seaweedfs"
    read -r s3 s3grpc mport mgrpc vport vgrpc fport fgrpc aport agrpc <<<"$S3_PORTS"
    (umask 077; cat >"$d/s3.json" <<EOF
{"identities": [{"name": "orgmem", "credentials": [{"accessKey": "$UPSTREAM_ACCESS_KEY",
  "secretKey": "$UPSTREAM_SECRET_KEY"}], "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}
EOF
)
    clean_env
    (cd "$d" || exit 1; TMPDIR="$d" "${CLEAN_ENV[@]}" setsid "$BIN/weed" "-logdir=$d/log" mini "-dir=$d/data" \
        -ip=127.0.0.1 -ip.bind=127.0.0.1 "-s3.port=$s3" "-s3.port.grpc=$s3grpc" \
        "-s3.config=$d/s3.json" "-s3.localSocket=$d/s3.sock" \
        "-master.port=$mport" "-master.port.grpc=$mgrpc" "-volume.port=$vport" "-volume.port.grpc=$vgrpc" \
        "-filer.port=$fport" "-filer.port.grpc=$fgrpc" "-filer.localSocket=$d/filer.sock" \
        "-admin.port=$aport" "-admin.port.grpc=$agrpc" -admin.ui=false -webdav=false \
        -s3.port.iceberg=0 -s3.port.lance=0 -master.telemetry=false \
        >>"$d/weed.log" 2>&1 </dev/null & echo $! >"$d/weed.pid")
    # Ready when the bucket can be created and written (weed's filer and volume server come
    # up after its S3 port does).
    if ! AWS_ACCESS_KEY_ID=$UPSTREAM_ACCESS_KEY AWS_SECRET_ACCESS_KEY=$UPSTREAM_SECRET_KEY \
        "$PY" - "http://127.0.0.1:$s3" "$BUCKET" "$READY_TIMEOUT" "$(cat "$d/weed.pid")" <<'EOF'
import os, sys, time
import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
endpoint, bucket, timeout, pid = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", config=Config(
    signature_version="s3v4", s3={"addressing_style": "path"}, connect_timeout=1, read_timeout=5,
    retries={"max_attempts": 1}))
deadline, last = time.time() + timeout, None
while time.time() < deadline:
    if not os.path.exists(f"/proc/{pid}"):
        sys.exit(f"weed exited: see its log")
    try:
        try:
            s3.create_bucket(Bucket=bucket)
        except ClientError as exc:
            if exc.response["Error"]["Code"] not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise
        s3.put_object(Bucket=bucket, Key="local-cluster-probe", Body=b"ok")
        s3.delete_object(Bucket=bucket, Key="local-cluster-probe")
        sys.exit(0)
    except (BotoCoreError, ClientError) as exc:
        last = exc
        time.sleep(0.2)
sys.exit(f"weed not ready after {timeout:.0f}s ({last.__class__.__name__})")
EOF
    then
        say "seaweedfs failed to start; the end of $d/weed.log:" >&2
        tail -n 15 "$d/weed.log" >&2 || true
        return 1
    fi
}

stop_seaweed() {
    stop_pid "$(seaweed_pidfile)" weed TERM 15
    # weed names unix sockets in /tmp after its gRPC ports and leaves them when killed
    local p
    for p in ${S3_PORTS:-}; do rm -f /tmp/seaweedfs-*-"$p".sock; done
}

# ---------------------------------------------------------------------------- gateways

gateway_pidfile() { printf '%s' "$DIR/gateway-$1/gateway.pid"; }

# Start replica N in the background; wait_gateway says whether it became ready.
spawn_gateway() {
    local n=$1 port log
    port=$(gateway_port "$n")
    log="$DIR/gateway-$n/gateway.log"
    touch "$log"
    LOG_OFFSET[$n]=$(stat -c %s "$log")
    local extra=()
    [[ -n "${ORGMEM_CLUSTER_KEK:-}" ]] && extra+=("ORGMEM_KEK=$ORGMEM_CLUSTER_KEK")
    [[ -n "${ORGMEM_CLUSTER_UPSTREAM:-}" ]] && extra+=("ORGMEM_BACKEND_ENDPOINT=$ORGMEM_CLUSTER_UPSTREAM")
    clean_env
    "${CLEAN_ENV[@]}" \
        "ORGMEM_ROOT_ACCESS_KEY=$ORGMEM_ROOT_ACCESS_KEY" "ORGMEM_ROOT_SECRET_KEY=$ORGMEM_ROOT_SECRET_KEY" \
        "AWS_ACCESS_KEY_ID=${ORGMEM_CLUSTER_UPSTREAM_ACCESS_KEY:-$UPSTREAM_ACCESS_KEY}" \
        "AWS_SECRET_ACCESS_KEY=${ORGMEM_CLUSTER_UPSTREAM_SECRET_KEY:-$UPSTREAM_SECRET_KEY}" \
        AWS_DEFAULT_REGION=us-east-1 "${extra[@]}" \
        setsid "$BIN/orgmem" serve --config "$DIR/orgmem.toml" --port "$port" \
        --data "$DIR/gateway-$n/data" >>"$log" 2>&1 </dev/null &
    echo $! >"$(gateway_pidfile "$n")"
}

# 0 when replica N answers /ready; else prints why (its own start-up error) and returns 1.
wait_gateway() {
    local n=$1 port pid log deadline
    port=$(gateway_port "$n")
    pid=$(pid_of "$(gateway_pidfile "$n")")
    log="$DIR/gateway-$n/gateway.log"
    deadline=$((SECONDS + READY_TIMEOUT))
    while ((SECONDS < deadline)); do
        if ! kill -0 "$pid" 2>/dev/null; then
            local code=0
            wait "$pid" 2>/dev/null || code=$?
            say "gateway-$n (127.0.0.1:$port) failed to start (exit status $code):" >&2
            explain_failure "$log" "${LOG_OFFSET[$n]:-0}" >&2
            rm -f "$(gateway_pidfile "$n")"
            return 1
        fi
        [[ "$(http_status "http://127.0.0.1:$port/ready")" == 200 ]] && return 0
        sleep 0.1
    done
    say "gateway-$n (127.0.0.1:$port) was not ready after ${READY_TIMEOUT}s; stopping it. Its log:" >&2
    explain_failure "$log" "${LOG_OFFSET[$n]:-0}" >&2
    stop_pid "$(gateway_pidfile "$n")" orgmem TERM 10
    return 1
}

# The error lines `orgmem serve` printed since OFFSET (click's "Error: ..." / "Usage: ..."), or
# the end of what it printed.
explain_failure() {
    local text
    text=$(tail -c +"$(($2 + 1))" "$1")
    if grep -qE '^(Error|Usage):' <<<"$text"; then
        grep -E '^(Error|Usage):|^Try ' <<<"$text" | sed 's/^/  /'
    else
        tail -n 8 <<<"$text" | sed 's/^/  /'
    fi
}

# Start replicas (those not running) in parallel; report every one that fails.
start_gateways() {
    local n started=() failed=0
    for n in "$@"; do
        if alive "$(gateway_pidfile "$n")" orgmem >/dev/null; then continue; fi
        spawn_gateway "$n"
        started+=("$n")
    done
    for n in "${started[@]}"; do wait_gateway "$n" || failed=1; done
    return $failed
}

# ---------------------------------------------------------------------------- nginx

nginx_pidfile() { printf '%s' "$DIR/nginx/nginx.pid"; }

write_nginx_conf() {
    local user=""
    # Started as root, nginx would run its workers as nobody, who cannot enter a private
    # state directory; this is a loopback-only development cluster, so they stay root.
    [[ $(id -u) == 0 ]] && user="user root;"
    local n servers=()
    for n in "${REPLICAS[@]}"; do
        servers+=("        server 127.0.0.1:$(gateway_port "$n") max_fails=1 fail_timeout=5s;")
    done
    local line
    while IFS= read -r line; do
        if [[ "$line" == *@SERVERS@* ]]; then
            printf '%s\n' "${servers[@]}"
            continue
        fi
        line=${line//@USER@/$user}
        line=${line//@DIR@/$DIR/nginx}
        line=${line//@LB_PORT@/$LB_PORT}
        printf '%s\n' "$line"
    done <"$HERE/local-cluster.nginx.conf" >"$DIR/nginx/nginx.conf"
}

start_nginx() {
    if alive "$(nginx_pidfile)" nginx >/dev/null; then return 0; fi
    command -v "$NGINX" >/dev/null || die "nginx not found (apt-get install nginx, or set ORGMEM_CLUSTER_NGINX)"
    write_nginx_conf
    local args=(-p "$DIR/nginx/" -c "$DIR/nginx/nginx.conf" -e "$DIR/nginx/error.log")
    "$NGINX" "${args[@]}" -t -q || die "nginx refused $DIR/nginx/nginx.conf"
    clean_env
    "${CLEAN_ENV[@]}" "$NGINX" "${args[@]}"
    local deadline=$((SECONDS + 15))
    while ((SECONDS < deadline)); do
        [[ "$(http_status "http://127.0.0.1:$LB_PORT/health")" == 200 ]] && return 0
        sleep 0.1
    done
    say "nginx did not answer on 127.0.0.1:$LB_PORT; the end of $DIR/nginx/error.log:" >&2
    tail -n 10 "$DIR/nginx/error.log" >&2 || true
    return 1
}

stop_nginx() {
    stop_pid "$(nginx_pidfile)" nginx QUIT 15
}

# ---------------------------------------------------------------------------- commands

replicas_arg() {
    case "${1:-}" in
        all) printf '%s ' "${REPLICAS[@]}" ;;
        *)
            if [[ "${1:-}" =~ ^[1-9]$ ]] && ((${1} <= REPLICA_COUNT)); then
                printf '%s' "$1"
            else
                die "which replica? 1 to $REPLICA_COUNT or all (got '${1:-}')"
            fi ;;
    esac
}

cmd_start() {
    load_state_quietly
    set_replicas "${ORGMEM_CLUSTER_REPLICAS:-${REPLICA_COUNT:-2}}"
    mkdirs
    load_ports
    ensure_secrets
    write_config
    if ! start_seaweed; then stop_all; exit 1; fi
    # shellcheck disable=SC2046
    if ! start_gateways "${REPLICAS[@]}"; then
        stop_all
        die "the cluster did not start (see above); everything was stopped"
    fi
    if ! start_nginx; then stop_all; exit 1; fi
    cmd_status
}

stop_all() {
    stop_nginx
    local n
    for n in "${REPLICAS[@]}"; do stop_pid "$(gateway_pidfile "$n")" orgmem TERM 20; done
    stop_seaweed
}

cmd_stop() {
    [[ -d "$DIR" ]] || { say "nothing to stop: $DIR does not exist"; return 0; }
    DIR=$(cd "$DIR" && pwd)
    load_state_quietly
    stop_all
    say "stopped (the data stays in $DIR)"
}

load_state_quietly() {
    if [[ -f "$DIR/cluster.env" ]]; then
        # shellcheck disable=SC1091
        source "$DIR/cluster.env"
        set_replicas "${REPLICA_COUNT:-2}"
    fi
}

need_state() {
    [[ -f "$DIR/cluster.env" ]] || die "no cluster in $DIR (run start first)"
    DIR=$(cd "$DIR" && pwd)
    load_state_quietly
}

cmd_status() {
    need_state
    local ok=0 pid state n port
    if pid=$(alive "$(seaweed_pidfile)" weed); then state=running; else state=stopped; pid=-; ok=1; fi
    printf '%-10s %-8s pid %-8s %s (s3://%s/%s)\n' seaweedfs "$state" "$pid" "$S3_ENDPOINT" "$BUCKET" "$PREFIX"
    for n in "${REPLICAS[@]}"; do
        port=$(gateway_port "$n")
        if pid=$(alive "$(gateway_pidfile "$n")" orgmem); then
            [[ "$(http_status "http://127.0.0.1:$port/ready")" == 200 ]] && state=ready || { state=unready; ok=1; }
        else
            state=stopped; pid=-; ok=1
        fi
        printf '%-10s %-8s pid %-8s http://127.0.0.1:%s\n' "gateway-$n" "$state" "$pid" "$port"
    done
    if pid=$(alive "$(nginx_pidfile)" nginx); then
        [[ "$(http_status "http://127.0.0.1:$LB_PORT/health")" == 200 ]] && state=ready || { state=unready; ok=1; }
    else
        state=stopped; pid=-; ok=1
    fi
    printf '%-10s %-8s pid %-8s http://127.0.0.1:%s (load balancer: point clients here)\n' nginx "$state" "$pid" "$LB_PORT"
    return $ok
}

cmd_env() {
    need_state
    # shellcheck disable=SC1091
    source "$DIR/secrets/root.env"
    cat <<EOF
export ORGMEM_ENDPOINT=$LB_ENDPOINT
export ORGMEM_ACCESS_KEY=$ORGMEM_ROOT_ACCESS_KEY ORGMEM_SECRET_KEY=$ORGMEM_ROOT_SECRET_KEY
export AWS_ENDPOINT_URL=$LB_ENDPOINT AWS_DEFAULT_REGION=us-east-1
export AWS_ACCESS_KEY_ID=$ORGMEM_ROOT_ACCESS_KEY AWS_SECRET_ACCESS_KEY=$ORGMEM_ROOT_SECRET_KEY
EOF
}

cmd_gateway() {  # ACTION N
    need_state
    local n which
    which=$(replicas_arg "${2:-}") || exit 1
    case "$1" in
        kill-gateway) for n in $which; do stop_pid "$(gateway_pidfile "$n")" orgmem KILL 10; done ;;
        stop-gateway) for n in $which; do stop_pid "$(gateway_pidfile "$n")" orgmem TERM 20; done ;;
        start-gateway)
            ensure_secrets
            write_config
            # shellcheck disable=SC2086
            start_gateways $which || exit 1 ;;
    esac
}

cmd_destroy() {
    [[ -d "$DIR" ]] || return 0
    [[ -f "$DIR/cluster.env" ]] || die "$DIR holds no cluster (no cluster.env); not deleting it"
    cmd_stop
    rm -rf "$DIR"
    say "deleted $DIR"
}

declare -A LOG_OFFSET=()
case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    env) cmd_env ;;
    kill-gateway | stop-gateway | start-gateway) cmd_gateway "$1" "${2:-}" ;;
    destroy) cmd_destroy ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
