# shellcheck shell=bash
# Sourced by hack/kindenv.sh and hack/kind-images.sh (set LOG_NAME first): messages on stderr
# under the script's name, and timed steps whose times are printed at the end, so that a run
# says what it built and how long each piece took.
log() { echo "$LOG_NAME: $*" >&2; }
die() { log "$*"; exit 1; }

summary=()
# record NAME T0: NAME took from T0 (a value of $SECONDS) until now.
record() { summary+=("$(printf '%-44s %4ds' "$1" $((SECONDS - $2)))"); }
step() {
  local name=$1 t0=$SECONDS; shift
  "$@"
  record "$name" "$t0"
}
print_summary() {
  [ ${#summary[@]} -gt 0 ] || { log "everything cached (${SECONDS}s)"; return; }
  log "built:"; local s; for s in "${summary[@]}"; do log "  $s"; done
  log "total ${SECONDS}s"
}
