#!/usr/bin/env bash
# The project's images for kind, with or without an image registry (docs/kind.md, "The
# project's images without a registry"):
#   hack/kind-images.sh build    the operator, engine-simulator, router and Prometheus images, then
#                                `kind load` them into the cluster of `make kind-up` when it exists
#                                (make kind-images)
#   hack/kind-images.sh tags     the four image names, one a line (operator, engine-sim, router,
#                                prometheus)
#   hack/kind-images.sh changes DOCKERFILE
#                                the `docker import --change` lines made from DOCKERFILE's last
#                                stage (what the rootfs build gives each image)
# Where the Dockerfiles' base image can be had (it is in Docker's store, or the engine is not
# kindenv's offline one), `docker build` runs them. Otherwise each image is made from a Debian
# root filesystem (debootstrap, python3 + venv) with the project's wheel installed as the
# Dockerfile installs it, and `docker import` with the Dockerfile's ENV, LABEL, USER, EXPOSE,
# ENTRYPOINT and CMD. Cached under ~/.cache/pd-operator/kind/app-images; unchanged inputs keep
# their image (and its ID, so `kind load` skips nodes that have it).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
cd "$repo"

app_version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/pd-operator/Chart.yaml)
router_version=$(sed -n 's/^VLLM_ROUTER_VERSION = "\(.*\)"$/\1/p' operator/pd_operator/core/router.py)
# The chart's default image (repository pd-operator, tag = appVersion); the name that
# docs/install.md gives the simulator; core/router.py's DEFAULT_IMAGES["VLLM"].
OPERATOR_IMAGE=${OPERATOR_IMAGE:-pd-operator:$app_version}
ENGINE_SIM_IMAGE=${ENGINE_SIM_IMAGE:-pd-operator/engine-sim:dev}
ROUTER_IMAGE=${ROUTER_IMAGE:-vllm/vllm-router:v$router_version}
# The Prometheus of `make kind-e2e` (config/kind/prometheus.yaml): upstream's image where it can be
# pulled; without a registry the same name is made from Prometheus' Go module (its module version
# v0.X.Y is release 3.X.Y).
PROMETHEUS_MODULE_VERSION=${PROMETHEUS_MODULE_VERSION:-v0.316.0}
prometheus_minor=${PROMETHEUS_MODULE_VERSION#v0.}  # 316.0: release 3.16.0
PROMETHEUS_VERSION=${prometheus_minor:0:1}.$((10#${prometheus_minor:1:2})).${prometheus_minor#*.}
PROMETHEUS_IMAGE=${PROMETHEUS_IMAGE:-prom/prometheus:v$PROMETHEUS_VERSION}
PYTHON_IMAGE=${PYTHON_IMAGE:-python:3.11-slim-bookworm}  # the Dockerfiles' ARG default
# auto | dockerfile (docker build, docker pull) | rootfs (no registry needed)
KIND_IMAGES_BUILD=${KIND_IMAGES_BUILD:-auto}
DEBIAN_SUITE=${DEBIAN_SUITE:-bookworm}  # bookworm's python3 is 3.11, as in PYTHON_IMAGE
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CLUSTER=${KIND_CLUSTER:-pd-operator}
DOCKER=${DOCKER:-docker}
# What PYTHON_IMAGE's config gives every image before the Dockerfile's own instructions.
BASE_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
python_packages=python3,python3-venv,ca-certificates,netbase
INPUTS_LABEL=pdoperator.io/image-inputs
NODE_GROUP_LABEL=pdoperator.io/node-group  # config/kind/kind-cluster.yaml's accelerator workers

cache_root=${PD_KIND_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator/kind}
cache="$cache_root/app-images"
kindenv_env="$cache_root/run/kindenv.env"

LOG_NAME="kind-images"
# shellcheck source=hack/lib/timed-steps.sh
. "$here/lib/timed-steps.sh"
missing() { log "$*"; exit 2; }

# --- The Dockerfile's final stage as `docker import --change` instructions ----------------------
# One instruction a line; $PATH in ENV is PYTHON_IMAGE's PATH (docker import has no base to expand).
dockerfile_changes() {
  local file=$1
  printf 'ENV PATH=%s LANG=C.UTF-8\n' "$BASE_PATH"  # PYTHON_IMAGE's own ENV
  sed -e ':a' -e '/\\$/{N;s/\\\n/ /;ba' -e '}' "$file" \
    | sed -e 's/^[[:space:]]*//' -e '/^#/d' -e '/^$/d' -e 's/[[:space:]][[:space:]]*/ /g' \
    | awk '{ k = toupper($1) } k == "FROM" { n = 0; delete keep; next }
           k ~ /^(ENV|LABEL|USER|EXPOSE|ENTRYPOINT|CMD|WORKDIR)$/ { keep[n++] = $0 }
           END { for (i = 0; i < n; i++) print keep[i] }' \
    | sed -e "/^ENV /s|\\\$PATH|$BASE_PATH|g" -e "/^ENV /s|\\\${PATH}|$BASE_PATH|g"
}

router_changes() {
  printf 'ENV PATH=/opt/vllm-router/bin:%s LANG=C.UTF-8 PYTHONUNBUFFERED=1\n' "$BASE_PATH"
  printf 'LABEL org.opencontainers.image.title="vllm-router" org.opencontainers.image.version="%s"\n' "$router_version"
  echo 'EXPOSE 8000 29000'
  # The operator's router Deployment gives the whole command line (`vllm-router ...`).
  echo 'ENTRYPOINT ["vllm-router"]'
}

# --- Helpers for the rootfs build -----------------------------------------------------------------
hash_files() { find "$@" -type f ! -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-12; }

image_inputs() {  # ref: the inputs hash the image was made from, or nothing
  "$DOCKER" image inspect -f "{{index .Config.Labels \"$INPUTS_LABEL\"}}" "$1" 2>/dev/null || true
}

python_rootfs=""
ensure_python_rootfs() {
  local h; h=$(echo "$DEBIAN_SUITE $python_packages" | sha256sum | cut -c1-8)
  python_rootfs="$cache/python-rootfs-$DEBIAN_SUITE-$h.tar"
  [ -s "$python_rootfs" ] && return 0
  step "python rootfs ($DEBIAN_SUITE debootstrap)" build_python_rootfs
}

build_python_rootfs() {
  command -v debootstrap >/dev/null || missing "debootstrap not found (make kindenv installs it)"
  local dir="$cache/python-rootfs.tmp"
  rm -rf "$dir"
  debootstrap --variant=minbase --include="$python_packages" "$DEBIAN_SUITE" "$dir" "$DEBIAN_MIRROR" \
    >"$cache/debootstrap.log" 2>&1 || die "debootstrap failed; see $cache/debootstrap.log"
  rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/* "$dir"/usr/share/doc/* \
         "$dir"/usr/share/man/* "$dir"/usr/share/locale/* "$dir"/etc/resolv.conf
  tar -C "$dir" --numeric-owner -cf "$python_rootfs.tmp" . && mv "$python_rootfs.tmp" "$python_rootfs"
  rm -rf "$dir"
}

# Runs a sh script in the root filesystem $1 (chroot; /proc, DNS and the host's CA
# bundle for its duration, mounted in a private mount namespace that ends with it). The CA bundle
# is the host's trust for pip (a TLS-inspecting proxy's CA, say); it never goes into an image.
in_root() {
  local root=$1 script=$2 ca=${PIP_CERT:-${REQUESTS_CA_BUNDLE:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}}
  local env=(PATH="$BASE_PATH" HOME=/root LANG=C.UTF-8 PIP_NO_CACHE_DIR=1
             PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_CERT=/host-ca.crt)
  local v; for v in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_DEFAULT_TIMEOUT; do
    [ -z "${!v:-}" ] || env+=("$v=${!v}")
  done
  [ -f "$ca" ] || die "no CA bundle for pip at '$ca' (set PIP_CERT)"
  : >"$root/host-ca.crt"
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  unshare --mount --propagation private sh -ec '
    root=$1 ca=$2 script=$3; shift 3
    mount -t proc proc "$root/proc"
    mount --bind -o ro "$ca" "$root/host-ca.crt"
    exec chroot "$root" /usr/bin/env -i "$@" sh -ec "$script"' \
    sh "$root" "$ca" "$script" "${env[@]}"
  rm -f "$root/host-ca.crt" "$root/etc/resolv.conf"  # the container runtime provides resolv.conf
}

fresh_root() {  # dir: PYTHON_IMAGE's stand-in, unpacked
  rm -rf "$1"; mkdir -p "$1"
  tar -C "$1" -xf "$python_rootfs"
}

import_image() {  # root ref inputs-hash changes-file
  local root=$1 ref=$2 inputs=$3 changes=() line
  while IFS= read -r line; do changes+=(--change "$line"); done <"$4"
  changes+=(--change "LABEL $INPUTS_LABEL=$inputs")
  local replaced; replaced=$("$DOCKER" image inspect -f '{{.Id}}' "$ref" 2>/dev/null || true)
  tar -C "$root" --numeric-owner -c . | "$DOCKER" import "${changes[@]}" - "$ref" >/dev/null
  # The image this one replaces would stay behind untagged, a few hundred MB each rebuild.
  [ -z "$replaced" ] || "$DOCKER" image rm "$replaced" >/dev/null 2>&1 || true
}

# The project's source as the Dockerfile's COPY lines give it to the build stage.
stage_source() {  # flavor dir
  local dir=$1/src
  rm -rf "$dir"; mkdir -p "$dir"
  local paths=(pyproject.toml README.md requirements/constraints.txt)
  case $2 in
    operator) paths+=(operator/pd_operator) ;;  # Dockerfile: only the operator package
    engine-sim) paths+=(operator) ;;            # Dockerfile.engine-sim: pd_tools too
  esac
  tar -c --exclude=__pycache__ --exclude='*.egg-info' "${paths[@]}" | tar -x -C "$dir"
}

# --- One image of the project (operator | engine-sim) --------------------------------------------
build_project_image() {  # flavor ref dockerfile
  local flavor=$1 ref=$2 dockerfile=$3 work="$cache/work-$1"
  mkdir -p "$work"
  stage_source "$work" "$flavor"
  local extra=("$dockerfile" "$0"); [ "$flavor" = engine-sim ] && extra+=(hack/engine-sim)
  local inputs; inputs=$( { hash_files "$work/src" "${extra[@]}"; echo "$python_rootfs"; } | sha256sum | cut -c1-12)
  if [ "$(image_inputs "$ref")" = "$inputs" ]; then
    log "$ref: up to date ($inputs)"; rm -rf "$work"; return 0
  fi
  local t0=$SECONDS
  rm -rf "$work/wheels"
  "$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir "$work/wheels" "$work/src" >&2
  local root="$work/root"
  fresh_root "$root"
  mkdir -p "$root/wheels"
  cp "$work"/wheels/*.whl "$work/src/requirements/constraints.txt" "$root/wheels/"
  local venv_tar
  venv_tar="$cache/venv-pd-operator-$( { hash_files pyproject.toml requirements/constraints.txt; echo "$python_rootfs"; } | sha256sum | cut -c1-12).tar"
  # The virtualenv with the dependencies is cached, shared by the operator and simulator images,
  # and rebuilt when pyproject.toml or the constraints change; the wheel is reinstalled over it.
  local install
  if [ -s "$venv_tar" ]; then
    tar -C "$root" -xf "$venv_tar"
    install='/opt/pd-operator/bin/pip install --quiet --no-deps --force-reinstall /wheels/pd_operator-*.whl'
  else
    install='python3 -m venv /opt/pd-operator
      /opt/pd-operator/bin/pip install --quiet --constraint /wheels/constraints.txt /wheels/pd_operator-*.whl'
  fi
  # The Dockerfiles' checks, after their install.
  local check
  case $flavor in
    operator) check='rm /opt/pd-operator/bin/pdctl; /opt/pd-operator/bin/python -m pd_operator --help >/dev/null' ;;
    engine-sim) check='/opt/pd-operator/bin/python -c "import pd_tools.enginesim.http_engine"' ;;
  esac
  in_root "$root" "$install
    $check"
  if [ ! -s "$venv_tar" ]; then
    rm -f "$cache"/venv-pd-operator-*.tar  # older dependencies: only disk space
    tar -C "$root" --numeric-owner -cf "$venv_tar" opt/pd-operator
  fi
  rm -rf "$root/wheels"
  if [ "$flavor" = engine-sim ]; then  # COPY --chmod=0755 hack/engine-sim/vllm hack/engine-sim/python3
    install -d "$root/opt/engine-sim/bin"
    install -m 0755 hack/engine-sim/vllm hack/engine-sim/python3 "$root/opt/engine-sim/bin/"
  fi
  dockerfile_changes "$dockerfile" >"$work/changes"
  import_image "$root" "$ref" "$inputs" "$work/changes"
  rm -rf "$work"
  record "$ref" "$t0"
}

# --- The router: vllm-router from its wheel ------------------------------------------------------
build_router_image() {
  local ref=$1 work="$cache/work-router"
  local inputs; inputs=$( { hash_files requirements/constraints.txt "$0"; echo "$router_version $python_rootfs"; } | sha256sum | cut -c1-12)
  if [ "$(image_inputs "$ref")" = "$inputs" ]; then
    log "$ref: up to date ($inputs)"; return 0
  fi
  local t0=$SECONDS root="$work/root"
  mkdir -p "$work"; fresh_root "$root"
  mkdir -p "$root/wheels"; cp requirements/constraints.txt "$root/wheels/"
  local tar; tar="$cache/venv-vllm-router-$( { hash_files requirements/constraints.txt; echo "$router_version $python_rootfs"; } | sha256sum | cut -c1-12).tar"
  if [ -s "$tar" ]; then
    tar -C "$root" -xf "$tar"
  else
    in_root "$root" "python3 -m venv /opt/vllm-router
      /opt/vllm-router/bin/pip install --quiet --constraint /wheels/constraints.txt vllm-router==$router_version
      /opt/vllm-router/bin/vllm-router --help >/dev/null"
    rm -f "$cache"/venv-vllm-router-*.tar
    tar -C "$root" --numeric-owner -cf "$tar" opt/vllm-router
  fi
  rm -rf "$root/wheels"
  router_changes >"$work/changes"
  import_image "$root" "$ref" "$inputs" "$work/changes"
  rm -rf "$work"
  record "$ref" "$t0"
}

# --- Prometheus: built from its Go module ----------------------------------------------------------
prometheus_changes() {
  printf 'ENV PATH=%s\n' "$BASE_PATH"
  printf 'LABEL org.opencontainers.image.title="prometheus" org.opencontainers.image.version="%s" org.opencontainers.image.source="github.com/prometheus/prometheus/cmd/prometheus@%s"\n' \
    "$PROMETHEUS_VERSION" "$PROMETHEUS_MODULE_VERSION"
  echo 'USER 65534:65534'  # nobody, as upstream's image
  echo 'EXPOSE 9090'
  echo 'WORKDIR /prometheus'
  echo 'ENTRYPOINT ["/bin/prometheus"]'
  echo 'CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]'
}

# Debian's prometheus package (the tests' local Prometheus) is built without Kubernetes service
# discovery, which an in-cluster Prometheus needs: the binary comes from the Go module proxy, with
# only that discovery mechanism compiled in (Prometheus' remove_all_sd / enable_*_sd build tags).
prometheus_binary=""
ensure_prometheus_binary() {
  prometheus_binary="$cache/bin/prometheus-$PROMETHEUS_MODULE_VERSION"
  [ -x "$prometheus_binary" ] && return 0
  step "prometheus $PROMETHEUS_VERSION (go install)" build_prometheus_binary
}

build_prometheus_binary() {
  command -v go >/dev/null || missing "go not found: the in-cluster Prometheus is built from its Go module"
  local gobin="$cache/bin/gobin.tmp"
  rm -rf "$gobin"; mkdir -p "$gobin"
  (cd "$cache" && GOBIN="$gobin" CGO_ENABLED=0 GOFLAGS=-mod=mod go install \
    -tags remove_all_sd,enable_kubernetes_sd -trimpath -ldflags=-s \
    "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_MODULE_VERSION") \
    >"$cache/prometheus-build.log" 2>&1 || die "building Prometheus failed; see $cache/prometheus-build.log"
  mv "$gobin/prometheus" "$prometheus_binary"
  rm -rf "$gobin"
}

build_prometheus_image() {
  local ref=$1 work="$cache/work-prometheus"
  ensure_prometheus_binary
  local inputs; inputs=$( { sha256sum "$prometheus_binary" "$0"; echo "$python_rootfs"; } | sha256sum | cut -c1-12)
  if [ "$(image_inputs "$ref")" = "$inputs" ]; then
    log "$ref: up to date ($inputs)"; return 0
  fi
  local t0=$SECONDS root="$work/root"
  rm -rf "$work"; mkdir -p "$work"; fresh_root "$root"
  install -m 0755 "$prometheus_binary" "$root/bin/prometheus"
  install -d -o 65534 -g 65534 "$root/prometheus" "$root/etc/prometheus"
  printf 'scrape_configs: []\n' >"$root/etc/prometheus/prometheus.yml"
  chroot "$root" /bin/prometheus --version >/dev/null
  prometheus_changes >"$work/changes"
  import_image "$root" "$ref" "$inputs" "$work/changes"
  rm -rf "$work"
  record "$ref" "$t0"
}

# --- Modes, load, summary -------------------------------------------------------------------------
offline_engine() {  # the engine kindenv started (its runtime wrapper), where nothing is pulled
  "$DOCKER" info --format '{{json .Runtimes}}' 2>/dev/null | grep pd-runc-nosysresource >/dev/null
}

build_with_dockerfiles() {
  step "$OPERATOR_IMAGE (docker build)" env DOCKER_BUILDKIT=1 "$DOCKER" build -t "$OPERATOR_IMAGE" .
  step "$ENGINE_SIM_IMAGE (docker build)" env DOCKER_BUILDKIT=1 "$DOCKER" build \
    -f Dockerfile.engine-sim -t "$ENGINE_SIM_IMAGE" .
  local ref
  for ref in "$ROUTER_IMAGE" "$PROMETHEUS_IMAGE"; do
    "$DOCKER" image inspect "$ref" >/dev/null 2>&1 || step "$ref (docker pull)" "$DOCKER" pull "$ref"
  done
}

build_from_rootfs() {
  [ "$(id -u)" = 0 ] || missing "the rootfs build needs root (debootstrap, chroot)"
  PYTHON=${PYTHON_BIN:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
  mkdir -p "$cache"
  ensure_python_rootfs
  build_project_image operator "$OPERATOR_IMAGE" Dockerfile
  build_project_image engine-sim "$ENGINE_SIM_IMAGE" Dockerfile.engine-sim
  build_router_image "$ROUTER_IMAGE"
  build_prometheus_image "$PROMETHEUS_IMAGE"
}

kind_load() {
  local kind kubectl kubeconfig
  kind=$(sed -n 's/^KIND=//p' "$kindenv_env" 2>/dev/null || true); kind=${KIND:-${kind:-kind}}
  kubectl=$(sed -n 's/^KUBECTL=//p' "$kindenv_env" 2>/dev/null || true)
  kubeconfig=$(sed -n 's/^KUBECONFIG_FILE=//p' "$kindenv_env" 2>/dev/null || true)
  if ! command -v "$kind" >/dev/null 2>&1 || ! "$kind" get clusters 2>/dev/null | grep -x "$CLUSTER" >/dev/null; then
    log "no kind cluster '$CLUSTER': images built, not loaded (make kind-up, then this again)"
    return 0
  fi
  # Engine pods run only on the workers of a node group (they carry the fake cards); the
  # operator, router and Prometheus only on the others (the group workers are tainted, the
  # control plane too). Each image goes only where it can run: half the copying of loading all.
  local workers="" groups plain
  if [ -x "$kubectl" ] && [ -f "$kubeconfig" ]; then  # one list: each worker and its node group
    workers=$("$kubectl" --kubeconfig "$kubeconfig" get nodes -l '!node-role.kubernetes.io/control-plane' \
      --no-headers -o "custom-columns=NAME:.metadata.name,GROUP:.metadata.labels.${NODE_GROUP_LABEL//./\\.}")
  fi
  groups=$(awk '$2 != "<none>" { print $1 }' <<<"$workers" | paste -sd, -)
  plain=$(awk '$2 == "<none>" { print $1 }' <<<"$workers" | paste -sd, -)
  # kind skips the nodes that already hold an image with the same ID.
  if [ -n "$groups" ] && [ -n "$plain" ]; then
    step "kind load engine simulator ($groups)" "$kind" load docker-image "$ENGINE_SIM_IMAGE" \
      --name "$CLUSTER" --nodes "$groups"
    step "kind load operator, router, Prometheus ($plain)" "$kind" load docker-image \
      "$OPERATOR_IMAGE" "$ROUTER_IMAGE" "$PROMETHEUS_IMAGE" --name "$CLUSTER" --nodes "$plain"
  else
    step "kind load (cluster $CLUSTER, every node)" "$kind" load docker-image "$OPERATOR_IMAGE" \
      "$ENGINE_SIM_IMAGE" "$ROUTER_IMAGE" "$PROMETHEUS_IMAGE" --name "$CLUSTER"
  fi
}

build() {
  command -v "$DOCKER" >/dev/null 2>&1 || missing "'$DOCKER' not found (make kindenv provides Docker)"
  "$DOCKER" info >/dev/null 2>&1 || missing "the Docker daemon does not answer (make kindenv starts one)"
  local mode=$KIND_IMAGES_BUILD
  if [ "$mode" = auto ]; then
    if "$DOCKER" image inspect "$PYTHON_IMAGE" >/dev/null 2>&1 || ! offline_engine; then
      mode=dockerfile
    else
      mode=rootfs
    fi
  fi
  log "mode: $mode"
  case $mode in
    dockerfile) build_with_dockerfiles ;;
    rootfs) build_from_rootfs ;;
    *) die "KIND_IMAGES_BUILD must be auto, dockerfile or rootfs" ;;
  esac
  kind_load
  local ref
  for ref in "$OPERATOR_IMAGE" "$ENGINE_SIM_IMAGE" "$ROUTER_IMAGE" "$PROMETHEUS_IMAGE"; do
    log "$(printf '%-36s %s MB' "$ref" $(( $("$DOCKER" image inspect -f '{{.Size}}' "$ref") / 1000000 )))"
  done
  print_summary
}

case "${1:-build}" in
  build) build ;;
  tags) printf '%s\n' "$OPERATOR_IMAGE" "$ENGINE_SIM_IMAGE" "$ROUTER_IMAGE" "$PROMETHEUS_IMAGE" ;;
  changes) [ -f "${2:-}" ] || { echo "usage: $0 changes DOCKERFILE" >&2; exit 64; }; dockerfile_changes "$2" ;;
  *) echo "usage: $0 build|tags|changes DOCKERFILE" >&2; exit 64 ;;
esac
