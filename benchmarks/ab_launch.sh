# Sourced by the before/after benchmark scripts: one launch of one tree, its load logged.
#   OUT   where the results go (made here); LOG its log.txt
#   RUN_LOGS  where each launch's output goes (default /tmp: raw logs stay out of the repo)
# The trees are checked out at /tmp/orig (old) and /tmp/new (new); every launch shares one
# group secret.
LOG=$OUT/log.txt
RUN_LOGS=${RUN_LOGS:-/tmp}
mkdir -p "$OUT"
export CCDDP_GROUP_SECRET=${CCDDP_GROUP_SECRET:-$(python -c "import secrets; print(secrets.token_hex(32))")}
run() {  # name tree cmd...
  local name=$1 tree=$2; shift 2
  echo "$(date -u +%FT%TZ) start $name $tree load $(cut -d' ' -f1 /proc/loadavg)" >> "$LOG"
  ( cd /tmp/$tree && PYTHONPATH=/tmp/$tree/src timeout 900 "$@" ) > "$RUN_LOGS/$name-$tree.log" 2>&1
  echo "$(date -u +%FT%TZ) end $name $tree rc $? load $(cut -d' ' -f1 /proc/loadavg)" >> "$LOG"
}
