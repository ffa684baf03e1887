#!/usr/bin/env bash
# Jobs that outlive the call that starts them on a lent GPU machine (it stays warm between calls, and a
# process in a session of its own runs on until the machine goes back): staging calls then overlap with
# measurements, and a measurement may take longer than one call.
#   bash benchmarks/device/detach.sh start NAME CMD...   CMD in its own session, from a copy of the tree
#                                                        (the next call's tree replaces this one), its
#                                                        output in /tmp/detached/NAME.log, its exit status in
#                                                        /tmp/detached/NAME.rc; the caller's environment
#   bash benchmarks/device/detach.sh wait SECONDS [NAME...]  until those jobs (all) end or SECONDS pass
#   bash benchmarks/device/detach.sh collect             each job's state and the end of its log, and every
#                                                        job's files (/tmp/detached, /tmp/mslogs) as $OUT/detached.tgz
# A job writes its results under its own OUT, /tmp/detached/NAME.out (the call's $OUT is emptied by the next call).
set -u
D=/tmp/detached; mkdir -p $D
verb=${1:?start, wait or collect}; shift
case $verb in
  start)
    name=${1:?name}; shift
    [ -f "$D/$name.pid" ] && [ ! -f "$D/$name.rc" ] && kill -0 "$(cat "$D/$name.pid")" 2>/dev/null \
        && { echo "job $name is still running" >&2; exit 1; }
    rm -f "$D/$name.rc"; mkdir -p "$D/$name.out" "$D/$name.tree"
    tar cf - --exclude=./.git --exclude='./.gpuwt*' --exclude=./.models --exclude=./.whl --exclude=./.vllm . \
        | tar xf - -C "$D/$name.tree"
    OUT=$D/$name.out setsid bash -c 'cd "$1/$2.tree"; shift 2; "$@"; echo $? > '"$D/$name.rc" \
        _ "$D" "$name" "$@" > "$D/$name.log" 2>&1 < /dev/null &
    echo $! > "$D/$name.pid"
    echo "== $name started $(date -u +%T): $*" ;;
  wait)
    limit=${1:?seconds}; shift
    names=("$@"); [ ${#names[@]} -eq 0 ] && names=($(cd $D && ls *.pid 2>/dev/null | sed 's/\.pid$//'))
    n=0
    while [ $n -lt "$limit" ]; do
      busy=0; for j in "${names[@]}"; do [ -f "$D/$j.rc" ] || busy=1; done
      [ $busy = 0 ] && break
      sleep 2; n=$((n + 2))
    done
    echo "== waited ${n}s" ;;
  collect)
    for p in "$D"/*.pid; do
      [ -e "$p" ] || continue
      j=$(basename "$p" .pid)
      if [ -f "$D/$j.rc" ]; then s="ended rc=$(cat "$D/$j.rc")"; else s="running"; fi
      echo "######## $j: $s"; tail -n ${TAIL:-25} "$D/$j.log"
    done
    OUT=${OUT:-/tmp/areal_out}; mkdir -p "$OUT"
    tar czf "$OUT/detached.tgz" --exclude='*.tree' -C /tmp detached $(cd /tmp && ls -d mslogs 2>/dev/null) ;;
  *) echo "usage: detach.sh start NAME CMD... | wait SECONDS [NAME...] | collect" >&2; exit 2 ;;
esac
