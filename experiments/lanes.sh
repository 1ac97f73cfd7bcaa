#!/usr/bin/env bash
# A lane: runs the lines of a queue written by `ovq-cl pieces NAME > QUEUE` one after the other, each
# with one thread, from the checkout its commit names (../ovq-cl-COMMIT beside this one, with its own
# .venv; this checkout for "-"), and merges each finished piece's record into the study's file here
# (`ovq-cl merge`), so that a finished run is kept the moment it ends. Start it twice on one queue for
# two lanes. Lines may be added or reordered while lanes run: write the new queue to another file and
# `mv` it over this one (a queue rewritten in place can be read empty, and a lane then stops).
#   usage: experiments/lanes.sh QUEUE [UNTIL]    (logs: QUEUE.log, one per run: QUEUE.<pid>.<n>.log)
# A line is known by its text without the "# ~M min" estimate (which a queue written later may update).
# It is taken while its lock (QUEUE.locks/<checksum of that text>) is held: the lane takes it under the
# queue's lock and its run inherits it, so it is held while the lane or its run lives, and released when
# both have ended, however they end (the kernel drops a dead process's locks). A line that ended, well or
# not, is written to QUEUE.ended and never run again; a run that was interrupted (rc 130, 137 or 143:
# Ctrl-C, SIGKILL or SIGTERM to it) did not end: its line stays free and its lane stops; a line whose lane and run died (a machine stopped
# mid-run) is free, and the next lane on the queue runs it again (its run resumes from its last
# checkpoint); a lane killed alone leaves its run going and its line taken. QUEUE.claimed logs the claims
# (PID<TAB>LINE); it decides nothing. (Lanes of this script from before 2026-12-05 take no line locks:
# never run them beside these on one queue.)
# UNTIL (any time `date -d` reads, e.g. 18:10 or "+170 min"): the time the runs must end by (a session's
# end: a run still going then is lost). A line is claimed only if its expected wall time (the "# ~M min"
# that `ovq-cl pieces` writes from the study's finished runs) ends before UNTIL, so a lane near the end
# skips a long run for a short one; a line with no estimate is claimed until UNTIL itself.
# A queue line: COMMIT<TAB>STUDY_FILE<TAB>PIECE_FILE<TAB>COMMAND (what `ovq-cl pieces` prints).
set -u
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "lanes: usage: experiments/lanes.sh QUEUE [UNTIL] (a queue from: ovq-cl pieces NAME > QUEUE)"; exit 2; }
queue=$(realpath "$1")
here=$(cd "$(dirname "$0")/.." && pwd)
[ -f "$queue" ] || { echo "lanes: no queue file $1 (write one with: ovq-cl pieces NAME > QUEUE)"; exit 2; }
missing=$(cut -f1 "$queue" | grep -v '^#' | grep -v '^-$' | grep -v '^$' | sort -u | while read -r c; do
  [ -x "$here/../ovq-cl-$c/.venv/bin/ovq-cl" ] || echo "$c"; done)
if [ -n "$missing" ]; then
  for c in $missing; do echo "lanes: no checkout of $c: git worktree add ../ovq-cl-$c $c && make -C ../ovq-cl-$c install"; done
  exit 2
fi
until=""
if [ -n "${2:-}" ]; then
  until=$(date -d "$2" +%s 2>/dev/null) || { echo "lanes: UNTIL $2: not a time date -d reads (e.g. 17:20, '+90 min')"; exit 2; }
fi
mkdir -p "$queue.locks"
touch "$queue.claimed" "$queue.ended"
exec {queue_lock}>"$queue.lock"
n=0
while true; do
  if [ -n "$until" ] && [ "$(date +%s)" -ge "$until" ]; then
    echo "$(date -u +%FT%TZ) lane $$: past $2, claiming nothing more" >> "$queue.log"; exit 0
  fi
  line="" line_key="" line_lock=""
  flock "$queue_lock"
  now=$(date +%s)
  while IFS= read -r l || [ -n "$l" ]; do    # (a last line without its newline too)
    case "$l" in ""|"#"*) continue;; esac
    # a line is known by what it runs, without the "# ~M min" estimate, which a later queue may update
    key=$(printf "%s" "$l" | sed "s/  *# ~[0-9][0-9]* min$//")
    grep -qxF -- "$key" "$queue.ended" && continue
    if [ -n "$until" ]; then
      minutes=$(printf "%s" "$l" | sed -n "s/.*# ~\([0-9][0-9]*\) min$/\1/p")
      [ -n "$minutes" ] && [ $((now + minutes * 60)) -gt "$until" ] && continue    # would not end in time
    fi
    exec {fd}>"$queue.locks/$(printf "%s" "$key" | cksum | tr ' ' '-')"
    if flock -n "$fd"; then                  # free: neither a lane nor a run holds it
      line=$l line_key=$key line_lock=$fd
      printf "%s\t%s\n" "$$" "$l" >> "$queue.claimed"
      break
    fi
    exec {fd}>&-                             # taken
  done < "$queue"
  flock -u "$queue_lock"
  [ -z "$line" ] && { echo "$(date -u +%FT%TZ) lane $$: queue done${until:+ (or nothing left ends before $2)}" >> "$queue.log"; exit 0; }
  IFS=$'\t' read -r commit study_file piece_file command <<< "$line"
  dir=$here; [ "$commit" != "-" ] && dir=$here/../ovq-cl-$commit
  n=$((n + 1)); log="$queue.$$.$n.log"
  echo "$(date -u +%FT%TZ) lane $$ start ($log): $command" >> "$queue.log"
  # the run inherits the line's lock (not the queue's): the line stays taken while the run lives
  ( cd "$dir" && OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PATH="$dir/.venv/bin:$PATH" bash -c "$command" ) \
    > "$log" 2>&1 {queue_lock}>&-
  rc=$?
  # 130 (Ctrl-C), 143 (SIGTERM), 137 (SIGKILL) to the run: it was stopped, not ended; it is resumable (the
  # runner marks it KILLED and keeps its checkpoint). The line is left free, never written as ended, and
  # this lane stops (whoever stopped the run wanted the work stopped): the next lane resumes it.
  case $rc in 130|137|143)
    exec {line_lock}>&-
    echo "$(date -u +%FT%TZ) lane $$ stopped: its run was interrupted (rc=$rc), left for the next lane to resume: $command" >> "$queue.log"
    exit "$rc";;
  esac
  case "$piece_file" in /*) made=$piece_file;; *) made=$dir/$piece_file;; esac
  if [ $rc -eq 0 ] && [ -f "$made" ]; then
    (cd "$here" && .venv/bin/ovq-cl merge "$study_file" "$made") >> "$log" 2>&1 {queue_lock}>&-; rc=$?
  elif [ $rc -eq 0 ]; then                   # it ran, but wrote no piece: nothing to merge, said
    echo "lanes: the command wrote no $made: nothing merged" >> "$log"; rc=66
  fi
  flock "$queue_lock"
  printf "%s\n" "$line_key" >> "$queue.ended"  # ended before its lock is let go: no lane takes it between
  flock -u "$queue_lock"
  exec {line_lock}>&-
  echo "$(date -u +%FT%TZ) lane $$ end rc=$rc: $command" >> "$queue.log"
done
