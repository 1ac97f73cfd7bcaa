#!/usr/bin/env bash
# A lane: runs the lines of a queue written by `ovq-cl pieces NAME > QUEUE` one after the other, each
# with one thread, from the checkout its commit names (../ovq-cl-COMMIT beside this one, with its own
# .venv; this checkout for "-"), and merges each finished piece's record into the study's file here
# (`ovq-cl merge`), so that a finished run is kept the moment it ends. Start it twice on one queue for
# two lanes: a line is claimed under a lock, once. Lines may be added or reordered while lanes run.
#   usage: experiments/lanes.sh QUEUE [UNTIL]    (logs: QUEUE.log, one per run: QUEUE.<pid>.<n>.log)
# A claim names its lane (QUEUE.claimed: PID<TAB>LINE) and a line that ended, well or not, is written to
# QUEUE.ended: a line whose lane died with it (a killed lane, a machine stopped mid-run) is claimable again,
# so a later lane on the same queue picks it up (its run resumes from its last checkpoint), while a line
# that ended is never run twice.
# UNTIL (any time `date -d` reads, e.g. 18:10 or "+170 min"): the time the runs must end by (a session's
# end: a run still going then is lost). A line is claimed only if its expected wall time (the "# ~M min"
# that `ovq-cl pieces` writes from the study's finished runs) ends before UNTIL, so a lane near the end
# skips a long run for a short one; a line with no estimate is claimed until UNTIL itself.
# A queue line: COMMIT<TAB>STUDY_FILE<TAB>PIECE_FILE<TAB>COMMAND (what `ovq-cl pieces` prints).
set -u
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
touch "$queue.claimed" "$queue.ended"
n=0
while true; do
  if [ -n "$until" ] && [ "$(date +%s)" -ge "$until" ]; then
    echo "$(date -u +%FT%TZ) lane $$: past $2, claiming nothing more" >> "$queue.log"; exit 0
  fi
  line=$(flock "$queue.lock" bash -c '
    now=$(date +%s)
    alive() {    # a lane of this script still running as that PID (where /proc can say; else any process)
      if [ -d /proc/self ]; then [ -r "/proc/$1/cmdline" ] && tr "\0" " " < "/proc/$1/cmdline" | grep -q "lanes\.sh"
      else kill -0 "$1" 2> /dev/null; fi
    }
    while IFS= read -r l; do
      case "$l" in ""|"#"*) continue;; esac
      grep -qxF -- "$l" "$1.ended" && continue
      taken=""
      for pid in $(L="$l" awk -F "\t" "{ i = index(\$0, \"\t\"); if (substr(\$0, i + 1) == ENVIRON[\"L\"]) print \$1 }" "$1.claimed"); do
        case "$pid" in *[!0-9]*|"") continue;; esac
        alive "$pid" && taken=1
      done
      [ -n "$taken" ] && continue
      if [ -n "$2" ]; then
        minutes=$(printf "%s" "$l" | sed -n "s/.*# ~\([0-9][0-9]*\) min$/\1/p")
        [ -n "$minutes" ] && [ $((now + minutes * 60)) -gt "$2" ] && continue    # would not end in time
      fi
      printf "%s\t%s\n" "$3" "$l" >> "$1.claimed"; printf "%s" "$l"; break
    done < "$1"' _ "$queue" "$until" "$$")
  [ -z "$line" ] && { echo "$(date -u +%FT%TZ) lane $$: queue done${until:+ (or nothing left ends before $2)}" >> "$queue.log"; exit 0; }
  IFS=$'\t' read -r commit study_file piece_file command <<< "$line"
  dir=$here; [ "$commit" != "-" ] && dir=$here/../ovq-cl-$commit
  n=$((n + 1)); log="$queue.$$.$n.log"
  echo "$(date -u +%FT%TZ) lane $$ start ($log): $command" >> "$queue.log"
  ( cd "$dir" && OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PATH="$dir/.venv/bin:$PATH" bash -c "$command" ) > "$log" 2>&1
  rc=$?
  case "$piece_file" in /*) made=$piece_file;; *) made=$dir/$piece_file;; esac
  if [ $rc -eq 0 ] && [ -f "$made" ]; then
    (cd "$here" && .venv/bin/ovq-cl merge "$study_file" "$made") >> "$log" 2>&1; rc=$?
  fi
  flock "$queue.lock" bash -c 'printf "%s\n" "$2" >> "$1.ended"' _ "$queue" "$line"
  echo "$(date -u +%FT%TZ) lane $$ end rc=$rc: $command" >> "$queue.log"
done
