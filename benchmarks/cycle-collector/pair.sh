#!/bin/bash
# Paired CPU and wall time of one command, before and after, taking turns:
#   BEFORE_SRC=/path/to/before-worktree/src bash pair.sh N COMMAND...
# "before" runs with PYTHONPATH at BEFORE_SRC (its ranks inherit it), "after" with the
# installed tree. Prints "before|after USER_S SYS_S WALL_S" per run (GNU time; children included).
export CCDDP_GROUP_SECRET=${CCDDP_GROUP_SECRET:-9c41d0e2b7f35a86c1e4d92b07a3f6185de0c4b2a97f3e6d5c8b1a0f2e4d6c83}
: "${BEFORE_SRC:?set BEFORE_SRC to the before tree's src}"
n=$1; shift
err=$(mktemp)
for i in $(seq "$n"); do
  for v in before after; do
    if [ $v = before ]; then pp=$BEFORE_SRC; else pp=; fi
    /usr/bin/time -f "$v %U %S %e" env ${pp:+PYTHONPATH=$pp} "$@" > /dev/null 2>"$err" || { echo "FAIL $v"; tail -5 "$err"; }
    tail -1 "$err"
  done
done
rm -f "$err"
