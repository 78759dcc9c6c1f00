#!/usr/bin/env bash
# Runs one build of the test command's in the background, detached from it,
# and records how it went:
#
#   hack/background.sh DIR ITEM NICENESS COMMAND...
#
# writes DIR/ITEM.pid at once (its process id; a process group hack/test.sh
# kills if the run ends first, when started with `setsid -f`), the command's stdout to DIR/ITEM.out and its stderr to
# DIR/ITEM.log, and, when it ends, DIR/ITEM.done: "<exit code> <wall seconds>
# <CPU seconds>". hack/test.sh starts it with `setsid -f`, so it is not the
# test command's child and its CPU time is counted here, not in a step's.
set -uo pipefail
dir=$1 item=$2 niceness=$3; shift 3
echo $$ >"$dir/$item.pid"
ticks=$(getconf CLK_TCK)
start=$SECONDS rc=0
nice -n "$niceness" "$@" >"$dir/$item.out" 2>"$dir/$item.log" || rc=$?
# Fields 16 and 17 of /proc/PID/stat: the CPU time of this shell's waited-for
# children (cutime, cstime), in clock ticks.
read -r -a stat <"/proc/$$/stat"
echo "$rc $((SECONDS - start)) $(((stat[15] + stat[16]) / ticks))" >"$dir/$item.done.tmp"
mv "$dir/$item.done.tmp" "$dir/$item.done"
