#!/usr/bin/env bash
# Real kind clusters, with or without an image registry (docs/kind.md).
#   hack/kindenv.sh build   docker engine, kind, and a node image (make kindenv); idempotent
#   hack/kindenv.sh up      build, then the cluster of config/kind/kind-cluster.yaml on the
#                           pinned network, bridge CNI + routes, all nodes Ready (make kind-up)
#   hack/kindenv.sh down    delete the cluster and its network; stop dockerd by its PID if this
#                           script started it (make kind-down)
# Everything is cached under ~/.cache/pd-operator/kind. Writes $state/kindenv.env (KIND,
# KUBECTL, KIND_NODE_IMAGE, KIND_CLUSTER, KUBECONFIG_FILE) for hack/kind.sh.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.36.3}
KIND_VERSION=${KIND_VERSION:-v0.33.0}
CRICTL_VERSION=${CRICTL_VERSION:-v1.37.0}
COREDNS_VERSION=${COREDNS_VERSION:-v1.14.2}  # what kubeadm v1.36 deploys
DEBIAN_SUITE=${DEBIAN_SUITE:-bookworm}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CLUSTER=${KIND_CLUSTER:-pd-operator}
KIND_CONFIG=${KIND_CONFIG:-config/kind/kind-cluster.yaml}
# The kind network is pinned: the nodes get 172.18.0.2 onwards and nothing else on it exists.
KIND_SUBNET=${KIND_SUBNET:-172.18.0.0/24}
KIND_GATEWAY=${KIND_GATEWAY:-172.18.0.1}
KIND_BRIDGE=br-pd-kind  # the host side of the kind network
POD_SUBNET=10.244.0.0/16  # kind's default; each node gets a /24 of it
# auto: kind's published node image when a Docker engine was already running (a machine set up
# for Docker, where pulls work); a locally built one when this script had to start dockerd.
# published | local force either.
KINDENV_NODE_IMAGE=${KINDENV_NODE_IMAGE:-auto}

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
cache_root=${PD_KIND_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator/kind}
cache="$cache_root/k8s-$K8S_VERSION-kind-$KIND_VERSION"
bin="$cache/bin"
state="$cache_root/run"
mkdir -p "$bin" "$state"
build_env=(GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod)

LOG_NAME=kindenv
# shellcheck source=hack/lib/timed-steps.sh
. "$here/lib/timed-steps.sh"

need_root() { [ "$(id -u)" = 0 ] || die "$1 needs root (apt-get, dockerd, debootstrap)"; }

# --- Docker engine -------------------------------------------------------------------------
dockerd_pid_file="$state/dockerd.pid"
runtime_name=pd-runc-nosysresource

lacks_cap_sys_resource() {
  # CAP_SYS_RESOURCE is bit 24 of the bounding set.
  local bnd; bnd=$(awk '/^CapBnd:/ {print $2}' /proc/self/status)
  [ $(( (16#$bnd >> 24) & 1 )) = 0 ]
}

install_packages() {
  need_root "installing docker.io"
  log "installing Debian's docker.io, debootstrap, iptables"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    docker.io debootstrap iptables >&2
}

our_dockerd_pid() {
  local pid; pid=$(cat "$dockerd_pid_file" 2>/dev/null) || return 1
  [ -n "$pid" ] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep "dockerd .*--pidfile $dockerd_pid_file" >/dev/null \
    && echo "$pid"
}

start_dockerd() {
  need_root "starting dockerd"
  local args=(--pidfile "$dockerd_pid_file" --storage-driver overlay2
              --exec-opt native.cgroupdriver=cgroupfs --bridge=none)
  if lacks_cap_sys_resource; then
    # kind runs its nodes privileged; runc cannot grant a capability the kernel withholds.
    step_if_stale runc-nosysresource
    args+=(--add-runtime "$runtime_name=$bin/runc-nosysresource" --default-runtime "$runtime_name")
  fi
  record_host_state
  log "starting dockerd (log: $state/dockerd.log)"
  setsid dockerd "${args[@]}" >>"$state/dockerd.log" 2>&1 </dev/null 9>&- &  # 9: the lock
  local _
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && return 0; sleep 0.5; done
  die "dockerd did not answer in 30 s; see $state/dockerd.log"
}

# dockerd sets net.ipv4.ip_forward=1, the FORWARD policy to DROP, and adds the DOCKER,
# DOCKER-USER and DOCKER-ISOLATION-STAGE-1/2 chains (filter) and DOCKER (nat), with jumps from
# FORWARD, PREROUTING and OUTPUT; it leaves them when it stops. `down` undoes them when this
# script started dockerd and they were not there before.
record_host_state() {
  [ -f "$state/host-before.env" ] && return 0  # an earlier start's record, not yet undone
  {
    echo "IP_FORWARD=$(sysctl -n net.ipv4.ip_forward)"
    echo "FORWARD_POLICY=$(iptables -S FORWARD | awk '$1 == "-P" {print $3}')"
    if iptables-save | grep '^:DOCKER' >/dev/null; then echo HAD_DOCKER_CHAINS=1; else echo HAD_DOCKER_CHAINS=0; fi
  } >"$state/host-before.env"
}

undo_host_changes() {
  [ -f "$state/host-before.env" ] || return 0
  local IP_FORWARD FORWARD_POLICY HAD_DOCKER_CHAINS t rule c
  # shellcheck disable=SC1091
  . "$state/host-before.env"
  if [ "$HAD_DOCKER_CHAINS" = 0 ]; then
    for t in filter nat; do
      { iptables-save -t "$t" | grep -E '^-A [^ ]+ .*-j DOCKER' | grep -v '^-A DOCKER' || true; } \
        | sed 's/^-A /-D /' | while read -r rule; do eval "iptables -t $t $rule"; done
      for c in $(iptables-save -t "$t" | sed -n 's/^:\(DOCKER[^ ]*\) .*/\1/p'); do iptables -t "$t" -F "$c"; done
      for c in $(iptables-save -t "$t" | sed -n 's/^:\(DOCKER[^ ]*\) .*/\1/p'); do iptables -t "$t" -X "$c"; done
    done
  fi
  iptables -P FORWARD "$FORWARD_POLICY"
  sysctl -qw "net.ipv4.ip_forward=$IP_FORWARD"
  rm -f "$state/host-before.env"
  log "undid dockerd's iptables chains and sysctl (FORWARD policy $FORWARD_POLICY, ip_forward=$IP_FORWARD)"
}

have_packages() {
  command -v dockerd >/dev/null 2>&1 && command -v docker >/dev/null 2>&1 \
    && command -v debootstrap >/dev/null 2>&1 && command -v iptables >/dev/null 2>&1
}

ensure_docker() {
  if docker info >/dev/null 2>&1; then
    if our_dockerd_pid >/dev/null; then docker_ours=1; else docker_ours=""; fi
    return 0
  fi
  have_packages || step "docker.io debootstrap iptables (apt)" install_packages
  docker_ours=1
  step "dockerd start" start_dockerd
}

# --- Go binaries ---------------------------------------------------------------------------
build_k8s() {
  local cmd=$1 minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local ldflags="-s -w"
  for kv in "gitVersion=$K8S_VERSION" "gitMajor=1" "gitMinor=$minor" "gitTreeState=clean" \
            "buildDate=1970-01-01T00:00:00Z"; do
    ldflags+=" -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
  done
  (cd "$here/kind/kubernetes" && env "${build_env[@]}" go build -trimpath \
     -tags=selinux,notest,grpcnotrace -ldflags="$ldflags" -o "$bin/$cmd" "k8s.io/kubernetes/cmd/$cmd")
}
build_etcd() {
  (cd "$here/testbin/etcd" && env "${build_env[@]}" go build -trimpath -ldflags="-s -w" \
     -o "$bin/etcd" go.etcd.io/etcd/server/v3)
}
go_install() {  # name package@version
  local tmp; tmp=$(mktemp -d)
  GOBIN=$tmp env "${build_env[@]}" go install -trimpath -ldflags="-s -w" "$2"
  mv "$tmp/$(basename "${2%@*}")" "$bin/$1"; rmdir "$tmp"
}
build_tool() {  # pause, runc-nosysresource: hack/kind's own programs
  [ -x "$bin/$1" ] && [ "$bin/$1" -nt "$here/kind/$1/main.go" ] && return 0
  (cd "$here/kind" && env "${build_env[@]}" go build -trimpath -ldflags="-s -w" -o "$bin/$1" "./$1")
}

ensure_kind_binary() {
  [ -x "$bin/kind" ] || step "kind $KIND_VERSION" go_install kind "sigs.k8s.io/kind@$KIND_VERSION"
  [ -x "$bin/kubectl" ] || step "kubectl $K8S_VERSION" build_k8s kubectl
}

ensure_node_binaries() {
  local c
  for c in kubelet kubeadm kube-apiserver kube-controller-manager kube-scheduler kube-proxy; do
    [ -x "$bin/$c" ] || step "$c $K8S_VERSION" build_k8s "$c"
  done
  [ -x "$bin/etcd" ] || step "etcd (hack/testbin/etcd)" build_etcd
  [ -x "$bin/crictl" ] || step "crictl $CRICTL_VERSION" go_install crictl "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
  [ -x "$bin/coredns" ] || step "coredns $COREDNS_VERSION" go_install coredns "github.com/coredns/coredns@$COREDNS_VERSION"
  step_if_stale pause
}
step_if_stale() { [ -x "$bin/$1" ] && [ "$bin/$1" -nt "$here/kind/$1/main.go" ] || step "$1" build_tool "$1"; }

# --- Root filesystems and images -------------------------------------------------------------
base_tar="$cache/rootfs-$DEBIAN_SUITE.tar"
node_packages=systemd,systemd-sysv,dbus,containerd,runc,containernetworking-plugins,iptables,nftables,conntrack,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz,e2fsprogs,bash,ca-certificates,procps,jq,socat,ebtables,ipset

build_base_rootfs() {
  need_root "debootstrap"
  local dir="$cache/rootfs.tmp"
  rm -rf "$dir"
  debootstrap --variant=minbase --include="$node_packages" "$DEBIAN_SUITE" "$dir" "$DEBIAN_MIRROR" \
    >"$cache/debootstrap.log" 2>&1 || die "debootstrap failed; see $cache/debootstrap.log"
  rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/* "$dir"/usr/share/doc/* \
         "$dir"/usr/share/man/* "$dir"/usr/share/locale/*
  tar -C "$dir" --numeric-owner -cf "$base_tar.tmp" . && mv "$base_tar.tmp" "$base_tar"
  rm -rf "$dir"
}

# kubeadm's image names, as `kubeadm config images list` prints them.
image_list() { "$bin/kubeadm" config images list --kubernetes-version "$K8S_VERSION" 2>/dev/null; }

# One control-plane image: a root filesystem holding one static binary, saved as a docker archive.
build_image() {  # image-ref tar-path
  local ref=$1 out=$2 name=${1##*/}; name=${name%%:*}
  local dir; dir=$(mktemp -d)
  mkdir -p "$dir/usr/local/bin" "$dir/tmp" "$dir/etc"
  chmod 1777 "$dir/tmp"
  echo "root:x:0:0:root:/root:/sbin/nologin" >"$dir/etc/passwd"
  local changes=(--change 'ENV PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin')
  case $name in
    pause) cp "$bin/pause" "$dir/pause"; changes+=(--change 'ENTRYPOINT ["/pause"]') ;;
    coredns) cp "$bin/coredns" "$dir/coredns"; changes+=(--change 'ENTRYPOINT ["/coredns"]') ;;
    kube-proxy)
      # kube-proxy runs iptables, ip6tables and conntrack: it gets the node's userland.
      tar -C "$dir" -xf "$base_tar" --exclude=./usr/bin/containerd* --exclude=./usr/sbin/runc \
        --exclude=./usr/lib/cni --exclude=./usr/bin/ctr --exclude=./usr/lib/systemd \
        --exclude=./usr/bin/systemd* --exclude=./var/lib/dpkg
      cp "$bin/kube-proxy" "$dir/usr/local/bin/" ;;
    *) cp "$bin/$name" "$dir/usr/local/bin/" ;;
  esac
  tar -C "$dir" --numeric-owner -c . | docker import "${changes[@]}" - "$ref" >/dev/null
  docker save "$ref" -o "$out.tmp" && mv "$out.tmp" "$out"
  docker rmi "$ref" >/dev/null  # the archive is what is kept
  rm -rf "$dir"
}

ensure_images() {
  mkdir -p "$cache/images"
  local ref
  for ref in $(image_list); do
    local f; f="$cache/images/$(echo "$ref" | tr '/:' '__').tar"
    [ -s "$f" ] || step "image ${ref#registry.k8s.io/}" build_image "$ref" "$f"
  done
}

kind_src() {
  (cd "$here/kind/kubernetes" && GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kind@$KIND_VERSION") \
    | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p'
}

# The node's own files: kind's base image files (entrypoint, systemd units, containerd config)
# from the sigs.k8s.io/kind module, with the tweaks this kind of machine needs.
node_fs_tweaks() {
  local root=$1 src; src="$(kind_src)/images/base/files"
  [ -d "$src" ] || die "kind's base image files not found in the module cache"
  install -m 0755 "$src"/usr/local/bin/* "$root/usr/local/bin/"
  mkdir -p "$root/kind/bin" "$root/kind/manifests" "$root/etc/containerd" \
           "$root/etc/systemd/system/kubelet.service.d" "$root/etc/kubernetes/manifests" "$root/opt/cni"
  install -m 0644 "$src"/kind/README.txt "$root/kind/"
  install -m 0755 "$src"/kind/bin/* "$root/kind/bin/"
  install -m 0644 "$src"/etc/crictl.yaml "$root/etc/"
  install -m 0644 "$src"/etc/sysctl.d/* "$root/etc/sysctl.d/"
  install -m 0644 "$src"/etc/systemd/system/*.service "$src"/etc/systemd/system/*.slice "$root/etc/systemd/system/"
  install -m 0644 "$src"/etc/systemd/system/kubelet.service.d/* "$root/etc/systemd/system/kubelet.service.d/"
  # kubelet >= 1.35 refuses cgroup v1 unless told otherwise.
  echo "KUBELET_EXTRA_ARGS=--runtime-cgroups=/system.slice/containerd.service --fail-cgroupv1=false" \
    >"$root/etc/default/kubelet"
  # Debian's containerd 1.6 reads kind's v2 config; the pause image is kubeadm's, and kubelet
  # may not lower oom_score_adj without CAP_SYS_RESOURCE.
  local pause; pause=$(image_list | grep /pause:)
  sed -e "s|^\(  sandbox_image = \).*|\1\"$pause\"|" \
      -e 's|^\(  restrict_oom_score_adj = \).*|\1true|' \
      "$src/etc/containerd/config.toml" >"$root/etc/containerd/config.toml"
  grep -q 'restrict_oom_score_adj = true' "$root/etc/containerd/config.toml" || die "containerd config tweak failed"
  ln -sf /usr/bin/containerd "$root/usr/local/bin/containerd"  # kind's unit starts /usr/local/bin/containerd
  ln -sfn /usr/lib/cni "$root/opt/cni/bin"
  chroot "$root" ctr oci spec \
    | jq '.hooks.createContainer[.hooks.createContainer| length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \
    | jq 'del(.process.rlimits)' >"$root/etc/containerd/cri-base.json"
  # What kind's base Dockerfile does to systemd.
  rm -f "$root"/lib/systemd/system/sysinit.target.wants/systemd-tmpfiles-setup.service \
        "$root"/lib/systemd/system/multi-user.target.wants/* "$root"/etc/systemd/system/*.wants/* \
        "$root"/lib/systemd/system/local-fs.target.wants/* "$root"/lib/systemd/system/sockets.target.wants/*udev* \
        "$root"/lib/systemd/system/sockets.target.wants/*initctl* "$root"/lib/systemd/system/basic.target.wants/*
  echo "ReadKMsg=no" >>"$root/etc/systemd/journald.conf"
  mkdir -p "$root/etc/systemd/system/multi-user.target.wants"
  local u
  for u in kubelet containerd undo-mount-hacks; do
    ln -sf "/etc/systemd/system/$u.service" "$root/etc/systemd/system/multi-user.target.wants/$u.service"
  done
  ln -sf /dev/null "$root/etc/systemd/system/systemd-binfmt.service"
  # Binaries where kind's node image has them.
  install -m 0755 "$bin/kubelet" "$bin/kubeadm" "$bin/kubectl" "$root/usr/bin/"
  install -m 0755 "$bin/crictl" "$root/usr/local/bin/"
  echo -n "$K8S_VERSION" >"$root/kind/version"
  install -m 0644 "$here/kind/default-cni.yaml" "$root/kind/manifests/default-cni.yaml"
  install -m 0644 "$here/kind/default-storage.yaml" "$root/kind/manifests/default-storage.yaml"
}

# Imports the control-plane images into the node's containerd store (namespace k8s.io, pinned,
# not unpacked: kind's own recipe), with the host's containerd on the node's state folder.
import_images() {
  local root=$1 sock="$state/import-containerd.sock" cfg="$state/import-containerd.toml" pid _ f
  cat >"$cfg" <<EOF
version = 2
root = "$root/var/lib/containerd"
state = "$state/import-containerd"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$sock"
EOF
  containerd --config "$cfg" >"$state/import-containerd.log" 2>&1 9>&- &
  pid=$!
  for _ in $(seq 50); do ctr --address "$sock" version >/dev/null 2>&1 && break; sleep 0.2; done
  for f in "$cache"/images/*.tar; do
    ctr --address "$sock" -n k8s.io images import --label=io.cri-containerd.pinned=pinned \
      --no-unpack --digests "$f" >/dev/null || { kill "$pid"; wait "$pid" || true; die "ctr import $f failed"; }
  done
  kill "$pid"; wait "$pid" || true
  rm -rf "$state/import-containerd" "$sock" "$sock.ttrpc" "$cfg"
}

node_image_tag() {
  # The recipe's inputs name the image, so a changed script or helper builds a new one.
  local h; h=$( { cat "$0" "$here"/kind/default-*.yaml "$here"/kind/pause/main.go
                  stat -c '%n %s %Y' "$base_tar" "$cache"/images/*.tar "$bin"/*; } | sha256sum | cut -c1-10)
  echo "pd-operator/kind-node:$K8S_VERSION-$h"
}

build_node_image() {
  local ref=$1 root="$cache/node.tmp"
  rm -rf "$root"; mkdir -p "$root"
  tar -C "$root" -xf "$base_tar"
  node_fs_tweaks "$root"
  import_images "$root"
  # kind's image also sets STOPSIGNAL SIGRTMIN+3, which docker import cannot; kind removes its
  # nodes with docker rm -f, so no stop signal is ever sent.
  tar -C "$root" --numeric-owner -c . | docker import --change 'ENV container=docker' \
    --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' - "$ref" >/dev/null
  rm -rf "$root"
}

ensure_node_image() {
  if [ "$node_image_mode" = published ]; then
    KIND_NODE_IMAGE=""  # kind's own default, pulled by kind create
    return 0
  fi
  have_packages || step "docker.io debootstrap iptables (apt)" install_packages
  ensure_node_binaries
  [ -s "$base_tar" ] || step "rootfs ($DEBIAN_SUITE debootstrap)" build_base_rootfs
  ensure_images
  KIND_NODE_IMAGE=$(node_image_tag)
  docker image inspect "$KIND_NODE_IMAGE" >/dev/null 2>&1 || step "node image" build_node_image "$KIND_NODE_IMAGE"
  # Older node images of this recipe are only disk space.
  local old
  for old in $(docker images --format '{{.Repository}}:{{.Tag}}' pd-operator/kind-node | grep -vx "$KIND_NODE_IMAGE"); do
    docker rmi "$old" >/dev/null 2>&1 || true
  done
}

write_env() {
  cat >"$state/kindenv.env" <<EOF
KIND=$bin/kind
KUBECTL=$bin/kubectl
KIND_NODE_IMAGE=$KIND_NODE_IMAGE
KIND_CLUSTER=$CLUSTER
KUBECONFIG_FILE=$state/kubeconfig-$CLUSTER
EOF
}

build() {
  ensure_docker
  case $KINDENV_NODE_IMAGE in
    auto)
      # An engine with kindenv's runtime wrapper is one kindenv set up, even if not its child now.
      if [ -n "$docker_ours" ] || docker info --format '{{json .Runtimes}}' 2>/dev/null | grep "$runtime_name" >/dev/null; then
        node_image_mode=local
      else
        node_image_mode=published
      fi ;;
    published|local) node_image_mode=$KINDENV_NODE_IMAGE ;;
    *) die "KINDENV_NODE_IMAGE must be auto, published or local" ;;
  esac
  ensure_kind_binary
  ensure_node_image
  write_env
  log "docker: $(if [ -n "$docker_ours" ]; then echo "dockerd started by kindenv (PID $(our_dockerd_pid))"; else echo "an engine already running"; fi)"
  log "node image: ${KIND_NODE_IMAGE:-the published default of kind $KIND_VERSION} ($node_image_mode)"
  log "binaries: $bin"
  print_summary
}

# --- Cluster -----------------------------------------------------------------------------
kubeconfig="$state/kubeconfig-$CLUSTER"
k() { "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }

ensure_network() {
  local subnet
  subnet=$(docker network inspect kind --format '{{range .IPAM.Config}}{{.Subnet}} {{end}}' 2>/dev/null) || subnet=""
  case " $subnet " in
    *" $KIND_SUBNET "*) return 0 ;;
    "  ") ;;
    *) die "docker network 'kind' exists with subnet '$subnet', not $KIND_SUBNET: delete it (docker network rm kind) or set KIND_SUBNET" ;;
  esac
  local opts=(-o "com.docker.network.bridge.name=$KIND_BRIDGE")
  # Offline, nothing is pulled: without masquerade the nodes reach each other and the host,
  # and nothing beyond it. Published images need the nodes to reach a registry.
  [ "$node_image_mode" = published ] || opts+=(-o com.docker.network.bridge.enable_ip_masquerade=false)
  docker network create kind --driver bridge --subnet "$KIND_SUBNET" --gateway "$KIND_GATEWAY" \
    "${opts[@]}" >/dev/null
}

# Offline, what leaves the kind network other than to the host (pods dialing some outside
# address) is dropped on the host instead of routed on to its uplink.
confine_network() {
  [ "$node_image_mode" = local ] || return 0
  iptables -C DOCKER-USER -i "$KIND_BRIDGE" ! -o "$KIND_BRIDGE" -j DROP 2>/dev/null \
    || iptables -I DOCKER-USER -i "$KIND_BRIDGE" ! -o "$KIND_BRIDGE" -j DROP
}

# Bridge CNI on every node from its spec.podCIDR, and a route to each other node's pod range.
# Run again after nodes are added.
apply_cni() {
  local nodes node cidr ip
  nodes=$(k get nodes -o jsonpath='{range .items[*]}{.metadata.name} {.spec.podCIDR}{"\n"}{end}')
  declare -A node_ip=()
  while read -r node cidr; do
    ip=$(docker inspect -f '{{(index .NetworkSettings.Networks "kind").IPAddress}}' "$node")
    node_ip[$node]=$ip
  done <<<"$nodes"
  while read -r node cidr; do
    [ -n "$cidr" ] || die "node $node has no podCIDR yet"
    sed "s|@POD_CIDR@|$cidr|" "$here/kind/10-pd-bridge.conflist" \
      | docker exec -i "$node" sh -c 'mkdir -p /etc/cni/net.d && cat >/etc/cni/net.d/10-pd-bridge.conflist'
    local routes="" other ocidr
    while read -r other ocidr; do
      [ "$other" = "$node" ] || routes+="ip route replace $ocidr via ${node_ip[$other]}; "
    done <<<"$nodes"
    docker exec "$node" sh -c "$routes
      iptables -t nat -C POSTROUTING -s $POD_SUBNET ! -d $POD_SUBNET -j MASQUERADE 2>/dev/null \
        || iptables -t nat -A POSTROUTING -s $POD_SUBNET ! -d $POD_SUBNET -j MASQUERADE"
  done <<<"$nodes"
}

up() {
  build
  cd "$repo"
  if "$bin/kind" get clusters 2>/dev/null | grep -x "$CLUSTER" >/dev/null; then
    log "cluster '$CLUSTER' exists"
  else
    ensure_network
    local t0=$SECONDS image_args=()
    [ -z "$KIND_NODE_IMAGE" ] || image_args=(--image "$KIND_NODE_IMAGE")
    "$bin/kind" create cluster --name "$CLUSTER" --config "$KIND_CONFIG" "${image_args[@]}" --retain=false
    record "kind create cluster" "$t0"
  fi
  confine_network
  "$bin/kind" get kubeconfig --name "$CLUSTER" >"$kubeconfig"
  if [ "$node_image_mode" = local ]; then
    local t0=$SECONDS
    apply_cni
    record "bridge CNI + routes" "$t0"
  fi
  local t0=$SECONDS
  k wait --for=condition=Ready nodes --all --timeout=300s
  record "nodes Ready" "$t0"
  k get nodes -o wide
  log "context kind-$CLUSTER in ~/.kube/config; a copy: $kubeconfig; kubectl: $bin/kubectl"
  print_summary
}

down() {
  if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    if [ -x "$bin/kind" ] && "$bin/kind" get clusters 2>/dev/null | grep -x "$CLUSTER" >/dev/null; then
      "$bin/kind" delete cluster --name "$CLUSTER"
    fi
    # Only our network: the one on the pinned subnet with no containers left.
    while iptables -D DOCKER-USER -i "$KIND_BRIDGE" ! -o "$KIND_BRIDGE" -j DROP 2>/dev/null; do :; done
    if [ "$(docker network inspect kind --format '{{range .IPAM.Config}}{{.Subnet}}{{end}} {{len .Containers}}' 2>/dev/null)" = "$KIND_SUBNET 0" ]; then
      docker network rm kind >/dev/null
    fi
  fi
  rm -f "$kubeconfig"
  local pid
  if pid=$(our_dockerd_pid); then
    log "stopping dockerd (PID $pid, started by kindenv)"
    kill -TERM "$pid"
    local _
    for _ in $(seq 60); do [ -d "/proc/$pid" ] || break; sleep 0.5; done
    [ ! -d "/proc/$pid" ] || die "dockerd (PID $pid) still running after 30 s"
    rm -f "$dockerd_pid_file"
    undo_host_changes
  elif ! pgrep -x dockerd >/dev/null; then
    undo_host_changes  # ours stopped some other way; nothing else relies on Docker's chains
  fi
}

# One kindenv at a time: a second waits rather than race the first's dockerd or cluster.
exec 9>"$state/lock"
flock -w 1800 9 || die "another hack/kindenv.sh held $state/lock for 30 minutes"

case "${1:-build}" in
  build) build ;;
  up) up ;;
  down) down ;;
  *) echo "usage: $0 build|up|down" >&2; exit 64 ;;
esac
