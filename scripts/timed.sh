#!/bin/sh
# timed.sh NAME COMMAND...: runs COMMAND and then prints how long it took, so every run of
# `make test` (and CI's log) shows what each phase costs. Exits with COMMAND's status.
name=$1; shift
start=$(date +%s)
"$@"
status=$?
echo "== $name: $(( $(date +%s) - start )) s (exit $status)"
exit $status
