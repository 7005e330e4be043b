#!/usr/bin/env bash
# Build the CPU image from the repo's own Dockerfile with buildah, run it with podman and
# smoke-test it: wait for /ready, send one POST /v1/generate, check the answer, stop.
#
#   scripts/build_image.sh                      # FROM python:3.11-slim (needs Docker Hub)
#   LOCAL_BASE=1 scripts/build_image.sh         # no registry: a Debian base made by debootstrap
#
# The Dockerfile's FROM stays python:3.11-slim; with LOCAL_BASE=1 this script debootstraps the
# Debian release of this machine (bookworm: Python 3.11) with python3, pip and venv, puts a
# venv on PATH (so `python` and `pip` behave as in python:3.11-slim), imports it as
# $BASE_TAG and passes it as --build-arg BASE_IMAGE. The base is built once and reused.
#
# Settings (environment):
#   IMAGE=localhost/tad-serve:<version>  the image to build and run (the version in pyproject.toml)
#   LOCAL_BASE=0|1                    build on the debootstrapped Debian base (needs root, debootstrap)
#   BASE_TAG=localhost/tad-base:<suite>  REBUILD_BASE=0|1
#   DEBIAN_SUITE=<this machine's codename, else bookworm>  DEBIAN_MIRROR=http://deb.debian.org/debian
#   LOCAL_WHEELS=$LOCAL_BASE          make this machine's pip sources visible to the build: the
#                                     find-links / extra-index-url of the host's pip (env or config)
#                                     that are local directories are bind-mounted read-only and a
#                                     pip.conf naming them (and the host pip's CA bundle, for a
#                                     TLS-inspecting proxy) is mounted at /etc/pip.conf, during the
#                                     build only (the empty mount points buildah leaves behind are
#                                     removed afterwards). torch then comes from there:
#   TORCH_INDEX_URL                   passed as a build arg when set; with LOCAL_WHEELS=1 it
#                                     defaults to empty (= pip's configuration decides)
#   TORCH_SPEC                        passed as a build arg when set
#   SKIP_BUILD=0|1  SKIP_RUN=0|1      only run an existing image / only build
#   NO_CACHE=0|1                      buildah bud --no-cache
#   NETWORK=bridge|host               bridge: -p 127.0.0.1:$PORT:8000; host: the host's network, TAD_PORT=$PORT
#   PORT=18000  READY_TIMEOUT=900 (s)  CONTAINER=tad-smoke  KEEP=0|1 (leave the container running)
#   WARM=1                            after the stop, start the same container again (its /cache
#                                     volume now holds the dequantised model) and time /ready again
#   NICE=15                           niceness of the heavy steps (debootstrap, build)
#   RUN_ARGS                          extra `podman run` arguments
#   ULIMITS="nofile=S:H nproc=S:H"    rlimits of the build steps and the container (auto: see sandbox_compat)
#   PODMAN_RUNTIME=crun|runc          OCI runtime of `podman run` (auto: runc on a cgroup-hybrid host)
#   RESULTS=                          also write the measured numbers as JSON to this file
#
# Every step says what it does; a failure names the step and exits non-zero.
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

# Tagged with the package version, as deploy/k8s and docker-compose.yml name it.
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE=${IMAGE:-localhost/tad-serve:$VERSION}
LOCAL_BASE=${LOCAL_BASE:-0}
LOCAL_WHEELS=${LOCAL_WHEELS:-$LOCAL_BASE}
# shellcheck disable=SC1091
DEBIAN_SUITE=${DEBIAN_SUITE:-$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")}
DEBIAN_SUITE=${DEBIAN_SUITE:-bookworm}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
BASE_TAG=${BASE_TAG:-localhost/tad-base:$DEBIAN_SUITE}
REBUILD_BASE=${REBUILD_BASE:-0}
SKIP_BUILD=${SKIP_BUILD:-0}
NO_CACHE=${NO_CACHE:-0}
SKIP_RUN=${SKIP_RUN:-0}
NETWORK=${NETWORK:-bridge}
PORT=${PORT:-18000}
READY_TIMEOUT=${READY_TIMEOUT:-900}
CONTAINER=${CONTAINER:-tad-smoke}
KEEP=${KEEP:-0}
WARM=${WARM:-1}
NICE=${NICE:-15}
RUN_ARGS=${RUN_ARGS:-}
RESULTS=${RESULTS:-}
PROMPT=${PROMPT:-What is the capital of France?}

STEP="start"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tad-build.XXXXXX")
STARTED_CONTAINER=""

log() { printf '[build_image] %s\n' "$*" >&2; }
step() { STEP=$1; log "== $STEP"; }
die() { log "FAILED at step '$STEP': $*"; exit 1; }
heavy() { nice -n "$NICE" "$@"; }

cleanup() {
    local rc=$?
    if [ -n "$STARTED_CONTAINER" ] && [ "$KEEP" != 1 ]; then
        podman rm -f -v -t 5 "$STARTED_CONTAINER" >/dev/null 2>&1 || true
    fi
    rm -rf "$WORK"
    if [ $rc -ne 0 ]; then log "exit $rc (last step: '$STEP')"; fi
}
trap cleanup EXIT
trap 'die "command failed (line $LINENO): $BASH_COMMAND"' ERR

need() { command -v "$1" >/dev/null 2>&1 || die "'$1' not found; on Debian: apt-get install -y --no-install-recommends $2"; }
now() { date +%s.%N; }
elapsed() { python3 -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.1f}")' "$1" "$2"; }

# ---------------------------------------------------------------------------------------------
# Restricted hosts (sandboxes, VMs). Without CAP_SYS_RESOURCE podman's default rlimits
# (nofile/nproc 1048576 for root) cannot be set: "setrlimit `RLIMIT_NOFILE`: Operation not
# permitted", so containers and build steps get limits this host allows. crun refuses a cgroup
# "hybrid" host (v1 controllers plus a v2 hierarchy with controllers): "cgroups in hybrid mode
# not supported"; runc runs there. Override with ULIMITS="nofile=S:H nproc=S:H" / PODMAN_RUNTIME.
ULIMIT_ARGS=()
RUNTIME_ARGS=()
sandbox_compat() {
    local cap u
    cap=$(awk '/^CapEff:/ {print $2}' /proc/self/status 2>/dev/null || true)
    if [ -z "${ULIMITS+x}" ] && [ -n "$cap" ] && (((16#$cap >> 24 & 1) == 0)); then
        ULIMITS="nofile=$(ulimit -Sn):$(ulimit -Hn) nproc=4096:4096"
        log "no CAP_SYS_RESOURCE: containers get --ulimit $ULIMITS"
    fi
    for u in ${ULIMITS:-}; do ULIMIT_ARGS+=(--ulimit "$u"); done
    if [ -z "${PODMAN_RUNTIME:-}" ] && [ -n "$(cat /sys/fs/cgroup/unified/cgroup.controllers 2>/dev/null)" ] &&
        [ "$(podman info --format '{{.Host.OCIRuntime.Name}}' 2>/dev/null)" = crun ]; then
        command -v runc >/dev/null || die "cgroup hybrid mode, which crun refuses: apt-get install -y runc (or set PODMAN_RUNTIME)"
        PODMAN_RUNTIME=runc
        log "cgroup hybrid mode: podman --runtime runc"
    fi
    if [ -n "${PODMAN_RUNTIME:-}" ]; then RUNTIME_ARGS=(--runtime "$PODMAN_RUNTIME"); fi
}
pod() { podman "${RUNTIME_ARGS[@]}" "$@"; }

# ---------------------------------------------------------------------------------------------
# The local base: debootstrap of $DEBIAN_SUITE, a venv on PATH, imported as $BASE_TAG.
build_base() {
    step "base image $BASE_TAG (debootstrap $DEBIAN_SUITE)"
    if [ "$REBUILD_BASE" != 1 ] && podman image exists "$BASE_TAG"; then
        log "reusing $BASE_TAG (REBUILD_BASE=1 rebuilds it)"
        return
    fi
    [ "$(id -u)" = 0 ] || die "debootstrap needs root (or build $BASE_TAG elsewhere and load it)"
    need debootstrap debootstrap
    local rootfs="$WORK/rootfs"
    heavy debootstrap --variant=minbase \
        --include=python3,python3-pip,python3-venv,ca-certificates,passwd \
        "$DEBIAN_SUITE" "$rootfs" "$DEBIAN_MIRROR" >"$WORK/debootstrap.log" 2>&1 ||
        { tail -20 "$WORK/debootstrap.log" >&2; die "debootstrap failed (log above)"; }
    # python:3.11-slim has `python` and `pip` on PATH and lets pip install as root; Debian's
    # python is externally managed (PEP 668), so the image gets a venv in front of PATH instead.
    chroot "$rootfs" /usr/bin/python3 -m venv /opt/venv
    chroot "$rootfs" /opt/venv/bin/python -c 'import sys, ssl; assert sys.version_info[:2] >= (3, 11), sys.version'
    chroot "$rootfs" apt-get clean
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/log/* \
        "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
        "$rootfs"/usr/share/locale/* "$rootfs"/debootstrap
    : >"$rootfs"/etc/machine-id
    tar --numeric-owner --xattrs -C "$rootfs" -cf "$WORK/rootfs.tar" .
    rm -rf "$rootfs"
    podman import \
        --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["python3"]' \
        --message "debootstrap --variant=minbase $DEBIAN_SUITE + python3, pip, venv (/opt/venv)" \
        "$WORK/rootfs.tar" "$BASE_TAG" >/dev/null
    rm -f "$WORK/rootfs.tar"
    pod run --rm --network none "${ULIMIT_ARGS[@]}" "$BASE_TAG" sh -c 'python --version && pip --version' >&2 ||
        die "the imported base cannot run python/pip"
}

# ---------------------------------------------------------------------------------------------
# This machine's pip sources, for a build that cannot reach download.pytorch.org.
pip_setting() { # $1 = env var name, $2 = pip config key
    local v="${!1:-}"
    if [ -z "$v" ]; then
        v=$( (pip config get "global.$2" || python3 -m pip config get "global.$2") 2>/dev/null | head -1) || v=""
    fi
    printf '%s' "$v"
}

WHEEL_ARGS=()
MOUNT_TARGETS=()
local_wheels() {
    step "local pip sources for the build"
    local find_links extra cert mounts=() src dir
    find_links=$(pip_setting PIP_FIND_LINKS find-links)
    extra=$(pip_setting PIP_EXTRA_INDEX_URL extra-index-url)
    for src in $find_links $extra; do
        dir=${src#file://}
        case "$dir" in /*) ;; *) continue ;; esac  # remote indexes stay reachable as they are
        [ -d "$dir" ] || { log "skipping $src: no such directory"; continue; }
        # A PEP 503 index ".../simple" links to files beside it (../../files): mount its parent.
        if [ "$(basename "$dir")" = simple ]; then dir=$(dirname "$dir"); fi
        case " ${mounts[*]-} " in *" $dir "*) ;; *) mounts+=("$dir") ;; esac
    done
    [ ${#mounts[@]} -gt 0 ] || die "LOCAL_WHEELS=1 but the host's pip has no local find-links/extra-index-url"
    # The host's CA bundle for pip, where PyPI is reached through a TLS-inspecting proxy.
    cert=$(pip_setting PIP_CERT cert)
    if [ -n "$cert" ] && [ -f "$cert" ]; then
        WHEEL_ARGS+=(--volume "$cert:/etc/pip-build-ca.crt:ro")
        MOUNT_TARGETS+=(/etc/pip-build-ca.crt)
    else
        cert=""
    fi
    {
        echo "[global]"
        if [ -n "$find_links" ]; then echo "find-links = $find_links"; fi
        if [ -n "$extra" ]; then echo "extra-index-url = $extra"; fi
        if [ -n "$cert" ]; then echo "cert = /etc/pip-build-ca.crt"; fi
    } >"$WORK/pip.conf"
    sed 's/^/    /' "$WORK/pip.conf" >&2
    for dir in "${mounts[@]}"; do
        case "$dir" in /opt/venv | /opt/venv/* | /srv | /srv/*) die "cannot mount $dir over the image's own files" ;; esac
        WHEEL_ARGS+=(--volume "$dir:$dir:ro")
        MOUNT_TARGETS+=("$dir")
    done
    WHEEL_ARGS+=(--volume "$WORK/pip.conf:/etc/pip.conf:ro")
    MOUNT_TARGETS+=(/etc/pip.conf)
    log "mounted read-only: ${mounts[*]}"
}

# ---------------------------------------------------------------------------------------------
build_image() {
    need buildah buildah
    local args=(--isolation chroot --format docker --layers -f Dockerfile -t "$IMAGE" "${ULIMIT_ARGS[@]}")
    if [ "$NO_CACHE" = 1 ]; then args+=(--no-cache); fi
    if [ "$LOCAL_BASE" = 1 ]; then
        build_base
        args+=(--pull=false --build-arg "BASE_IMAGE=$BASE_TAG")
    fi
    if [ "$LOCAL_WHEELS" = 1 ]; then
        local_wheels
        args+=("${WHEEL_ARGS[@]}" --build-arg "TORCH_INDEX_URL=${TORCH_INDEX_URL-}")
    elif [ -n "${TORCH_INDEX_URL+x}" ]; then
        args+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")
    fi
    if [ -n "${TORCH_SPEC+x}" ]; then args+=(--build-arg "TORCH_SPEC=$TORCH_SPEC"); fi

    step "buildah bud $IMAGE"
    log "buildah bud ${args[*]} ."
    local t0 t1
    t0=$(now)
    local hint=""
    if [ "$LOCAL_BASE" != 1 ]; then hint="; without access to Docker Hub use LOCAL_BASE=1"; fi
    heavy buildah bud "${args[@]}" . || die "buildah bud failed (output above)$hint"
    t1=$(now)
    BUILD_S=$(elapsed "$t0" "$t1")
    log "built $IMAGE in ${BUILD_S} s"
    if [ ${#MOUNT_TARGETS[@]} -gt 0 ]; then remove_mount_points; fi
}

# buildah (1.28, Debian bookworm) leaves the mount points of `bud --volume` in the image: empty
# directories and empty files. One more layer removes them (only if still empty).
remove_mount_points() {
    step "remove the build-only mount points from $IMAGE"
    local ctr mnt p removed=()
    ctr=$(buildah from --pull=false "$IMAGE")
    mnt=$(buildah mount "$ctr")
    for p in "${MOUNT_TARGETS[@]}"; do
        if [ -d "$mnt$p" ] && [ ! -L "$mnt$p" ] && [ -z "$(ls -A "$mnt$p")" ]; then
            rmdir "$mnt$p" && removed+=("$p")
        elif [ -f "$mnt$p" ] && [ ! -s "$mnt$p" ]; then
            rm -f "$mnt$p" && removed+=("$p")
        fi
    done
    buildah umount "$ctr" >/dev/null
    if [ ${#removed[@]} -gt 0 ]; then
        buildah commit --quiet --format docker --rm "$ctr" "$IMAGE" >/dev/null
        log "removed: ${removed[*]}"
    else
        buildah rm "$ctr" >/dev/null
    fi
}

# ---------------------------------------------------------------------------------------------
http_code() { curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$1" 2>/dev/null || true; }

wait_ready() { # $1 container, $2 url, $3 start time
    local code=""
    while :; do
        code=$(http_code "$2/ready")
        [ "$code" = 200 ] && return 0
        if [ "$(podman inspect -f '{{.State.Running}}' "$1" 2>/dev/null)" != true ]; then
            podman logs --tail 40 "$1" >&2 || true
            die "the container exited before /ready (logs above)"
        fi
        if [ "$(elapsed "$3" "$(now)" | cut -d. -f1)" -ge "$READY_TIMEOUT" ]; then
            podman logs --tail 40 "$1" >&2 || true
            die "/ready not 200 after ${READY_TIMEOUT}s (last status $code)"
        fi
        sleep 0.5
    done
}

run_and_check() {
    need podman podman
    need curl curl
    step "podman run $IMAGE"
    podman image exists "$IMAGE" || die "no image $IMAGE (build it first)"
    podman rm -f -t 5 "$CONTAINER" >/dev/null 2>&1 || true
    local net=() url
    if [ "$NETWORK" = host ]; then
        net=(--network host -e "TAD_PORT=$PORT")
    else
        net=(-p "127.0.0.1:$PORT:8000")
    fi
    url="http://127.0.0.1:$PORT"
    [ "$(http_code "$url/health")" = 000 ] || die "something already answers on $url; set PORT"
    local t0 t1 cid
    t0=$(now)
    # shellcheck disable=SC2086  # RUN_ARGS is a list of words
    cid=$(pod run -d --name "$CONTAINER" "${net[@]}" "${ULIMIT_ARGS[@]}" $RUN_ARGS "$IMAGE") ||
        die "podman run failed (output above); on a restricted host try NETWORK=host, ULIMITS=..., PODMAN_RUNTIME=runc or RUN_ARGS"
    STARTED_CONTAINER=$cid

    step "wait for $url/ready (cold start: container start -> /ready 200)"
    wait_ready "$cid" "$url" "$t0"
    t1=$(now)
    COLD_START_S=$(elapsed "$t0" "$t1")
    log "/ready 200 after ${COLD_START_S} s"

    step "the image's HEALTHCHECK"
    # Run once by hand: podman's periodic health checks need systemd timers, which not every host has.
    pod healthcheck run "$cid" || die "the HEALTHCHECK command fails in the running container"
    log "healthcheck passes"

    step "POST /v1/generate"
    local body
    body=$(python3 -c 'import json, sys; print(json.dumps({"messages": [{"role": "user", "content": sys.argv[1]}], "max_new_tokens": 8}))' "$PROMPT")
    t0=$(now)
    curl -sS --max-time 120 -o "$WORK/generate.json" -w '%{http_code}' "$url/v1/generate" \
        -H 'content-type: application/json' -d "$body" >"$WORK/generate.code" ||
        die "the request failed"
    t1=$(now)
    GENERATE_S=$(elapsed "$t0" "$t1")
    [ "$(cat "$WORK/generate.code")" = 200 ] || { cat "$WORK/generate.json" >&2; die "HTTP $(cat "$WORK/generate.code")"; }
    python3 - "$WORK/generate.json" <<'EOF' || die "the answer lacks text, a decision or uncertainty (above)"
import json, math, sys
r = json.load(open(sys.argv[1]))
print(json.dumps({k: r.get(k) for k in ("text", "finish_reason", "decision", "uncertainty", "usage", "model", "artifact", "tad_available")}, indent=1), file=sys.stderr)
assert isinstance(r.get("text"), str) and r["text"].strip(), "no text"
d = r.get("decision") or {}
assert isinstance(d.get("accept"), bool) and d.get("method"), "no decision"
u = r.get("uncertainty") or {}
scores = [v for v in u.values() if isinstance(v, (int, float)) and math.isfinite(v)]
assert scores, "no uncertainty scores"
assert u.get("tad") is not None and r.get("tad_available"), "TAD unavailable in the image (artifact not loaded)"
EOF
    log "answer OK in ${GENERATE_S} s"

    step "image size"
    IMAGE_BYTES=$(podman image inspect -f '{{.Size}}' "$IMAGE")
    IMAGE_SIZE=$(podman images --format '{{.Size}}' "$IMAGE" | head -1)
    log "$IMAGE: $IMAGE_SIZE ($IMAGE_BYTES bytes)"

    if [ "$KEEP" = 1 ]; then
        log "KEEP=1: container $CONTAINER left running on $url"
        STOP_S=null
        return
    fi
    step "podman stop $CONTAINER"
    t0=$(now)
    podman stop -t 40 "$cid" >/dev/null
    t1=$(now)
    STOP_S=$(elapsed "$t0" "$t1")
    local exit_code
    exit_code=$(podman inspect -f '{{.State.ExitCode}}' "$cid")
    log "stopped in ${STOP_S} s, exit code $exit_code"
    [ "$exit_code" = 0 ] || die "the server did not exit cleanly on SIGTERM (exit code $exit_code)"

    if [ "$WARM" = 1 ]; then
        # The same container again: its /cache volume now holds the dequantised model.
        step "warm start (podman start, /cache filled) -> /ready 200"
        t0=$(now)
        pod start "$cid" >/dev/null
        wait_ready "$cid" "$url" "$t0"
        WARM_START_S=$(elapsed "$t0" "$(now)")
        log "/ready 200 after ${WARM_START_S} s"
        podman stop -t 40 "$cid" >/dev/null
    fi
    podman rm -v "$cid" >/dev/null 2>&1 || true
    STARTED_CONTAINER=""
}

# ---------------------------------------------------------------------------------------------
BUILD_S=null COLD_START_S=null WARM_START_S=null GENERATE_S=null IMAGE_BYTES=null IMAGE_SIZE="" STOP_S=null
need podman podman
sandbox_compat
[ "$SKIP_BUILD" = 1 ] || build_image
[ "$SKIP_RUN" = 1 ] || run_and_check

step "summary"
summary=$(python3 - "$WORK/generate.json" <<EOF
import json, os, sys
null = None  # unmeasured values
r = json.load(open(sys.argv[1])) if os.path.exists(sys.argv[1]) else {}
print(json.dumps({
    "image": "$IMAGE", "base": "$([ "$LOCAL_BASE" = 1 ] && echo "$BASE_TAG" || echo "Dockerfile default")",
    "image_size": "$IMAGE_SIZE", "image_bytes": $IMAGE_BYTES, "build_s": $BUILD_S,
    "cold_start_s": $COLD_START_S, "warm_start_s": $WARM_START_S, "generate_s": $GENERATE_S, "stop_s": $STOP_S,
    "text": r.get("text"), "decision": r.get("decision"), "uncertainty": r.get("uncertainty"),
}, indent=1))
EOF
)
echo "$summary"
[ -z "$RESULTS" ] || echo "$summary" >"$RESULTS"
