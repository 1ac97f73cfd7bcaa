#!/usr/bin/env bash
# The reliability audit of issue 27, as a user runs it: the ovq-cl CLI in a fresh folder (default
# /tmp/ovq-cl-audit), tiny configs, one PASS/FAIL row per check. About 5 minutes on 2 cores (Ray and
# torchrun included). Usage: bash benchmarks/reliability_audit.sh [FOLDER]
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OVQ=${OVQ:-$ROOT/.venv/bin/ovq-cl}
PY=${PY:-$ROOT/.venv/bin/python}
export OMP_NUM_THREADS=1 RAY_worker_niceness=0
W=${1:-/tmp/ovq-cl-audit}
if [ -e "$W" ] && [ ! -f "$W/.ovq-cl-audit" ]; then echo "$W exists and is not an earlier audit's folder" >&2; exit 2; fi
rm -rf "$W"; mkdir -p "$W"; touch "$W/.ovq-cl-audit"; cd "$W"
cat > cfg.yaml <<'YAML'
model: {d_model: 32, n_layers: 1, n_heads: 2, layers: [ovq], mixers: {ovq: {num_slots: 16, chunk_size: 4}}}
stream: {name: icr, options: {n_experiences: 3, train_episodes: 8, test_episodes: 4, facts_per_experience: 6,
         facts_per_episode: 4, queries_per_episode: 2, test_queries: 3, meta_train_episodes: 64}}
strategy: {name: naive, train_mb_size: 4, lr: 0.003}
meta_train: {steps: 40, batch_size: 8, checkpoint_every: 10}
YAML
R() { grep '^R\[' "$1"; }
say() { printf '%-4s %-70s %s\n' "$1" "$2" "$3"; }
# 1. kill in meta-training and in the stream (SIGKILL), resume, same R as a straight run
$OVQ run cfg.yaml checkpoint.dir=ck/straight tracking.experiment=straight --quiet > straight.out
$OVQ run cfg.yaml checkpoint.dir=ck/killed --quiet > /dev/null & pid=$!; sleep 9; kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
$OVQ run cfg.yaml checkpoint.dir=ck/killed > killed.out 2> killed.err
diff <(R straight.out) <(R killed.out) > /dev/null && say 1 "SIGKILL then resume: same R as straight ($(grep -o 'resuming[^(]*' killed.err | head -1))" PASS || say 1 "SIGKILL resume" FAIL
# 2. truncated checkpoint falls back
f=$(ls ck/killed/*/last.pt | head -1); cp $f $f.bak; head -c 1000 $f.bak > $f
$OVQ run cfg.yaml checkpoint.dir=ck/killed tracking.experiment=trunc > trunc.out 2> trunc.err; rc=$?
[ $rc = 0 ] && say 2 "truncated last.pt: rc 0; said: $(head -c 120 trunc.err | tr '\n' ' ')" PASS || say 2 "truncated checkpoint rc=$rc" FAIL
# 3. torchrun two ranks = one process R
$PY -m torch.distributed.run --nproc_per_node 2 -m experiments.cli run cfg.yaml checkpoint.dir=ck/tr tracking.experiment=tr --quiet > tr.out 2> tr.err
diff <(R straight.out) <(R tr.out) > /dev/null && say 3 "torchrun 2 ranks: R equal to one process" PASS || { say 3 "torchrun R differs (tolerance?)" CHECK; R tr.out; }
# 4-5. plugin edit -> new result; --rerun says which meta-training it reuses
mkdir -p plug; cat > plug/myplug.py <<'P'
import torch
from ovq_cl.layers import register_mixer
from ovq_cl.layers.linear import LinearAttention
class Scaled(LinearAttention):
    def forward(self, x, state=None):
        out, st = super().forward(x, state)
        return out * SCALE, st
SCALE = 1.0
register_mixer("scaled", Scaled)
P
run_plug() { PYTHONPATH=plug $OVQ run cfg.yaml --plugin myplug 'model.layers=[scaled]' checkpoint.dir=ck/plug tracking.experiment=plug "$@"; }
run_plug > p1.out 2> p1.err; sed -i 's/SCALE = 1.0/SCALE = 0.0/' plug/myplug.py; run_plug > p2.out 2> p2.err
if ! diff <(R p1.out) <(R p2.out) >/dev/null && grep -q "code changed" p2.err; then say 4 "plugin edited: rerun with new R; said: $(grep -o 'the code changed[^)]*)' p2.err)" PASS; else say 4 "plugin edit" FAIL; fi
run_plug --rerun > p3.out 2> p3.err; say 5 "--rerun: $(grep -o 'reusing the meta-training[^(]*' p3.err | head -1)" "$([ -s p3.out ] && echo PASS || echo FAIL)"
# 6. compare counts a seed once
n=$($OVQ compare --tracking-uri sqlite:///mlruns.db --experiment plug 2>cmp.err | grep -c '(1)')
say 6 "compare over plug (3 finished runs, 2 code versions): rows with n=1: $n; $(head -c 100 cmp.err)" "$([ $n -ge 1 ] && echo PASS || echo FAIL)"
# 7. two stores keep their checkpoints and both resume
$OVQ run cfg.yaml checkpoint.dir=ck/st --quiet > /dev/null & pid=$!; sleep 9; kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
MLFLOW_TRACKING_URI=sqlite:///other.db $OVQ run cfg.yaml checkpoint.dir=ck/st --quiet > other.out
$OVQ run cfg.yaml checkpoint.dir=ck/st > first.out 2> first.err
diff <(R straight.out) <(R first.out) > /dev/null && grep -q resuming first.err && say 7 "two stores: first store resumes after a run in another store ($(ls ck/st | grep -c store) folders)" PASS || say 7 "two stores" FAIL
# 8. two processes on one run: one refusal
$OVQ run cfg.yaml checkpoint.dir=ck/two tracking.experiment=two meta_train.steps=400 checkpoint.share_meta=false --quiet > two1.out 2> two1.err & pid=$!; sleep 6
$OVQ run cfg.yaml checkpoint.dir=ck/two tracking.experiment=two meta_train.steps=400 checkpoint.share_meta=false > two2.out 2> two2.err; rc=$?; wait $pid
[ $rc = 2 ] && say 8 "second process: rc 2, $(wc -l < two2.err) line: $(cut -c1-90 two2.err)" PASS || say 8 "two processes rc=$rc" FAIL
# 9. Ray sweep: SIGTERM -> KILLED; restart resumes
$OVQ sweep cfg.yaml --grid 'seed=0;1' --name raysweep --out out --backend ray --quiet checkpoint.dir=ck/ray meta_train.steps=400 > ray.out 2> ray.err & pid=$!
sleep 25; kill -TERM $pid; wait $pid; rc=$?
st=$($PY - <<'Q'
import mlflow
c = mlflow.MlflowClient("sqlite:///mlruns.db")
e = c.get_experiment_by_name("ovq-cl")
print(sorted(r.info.status for r in c.search_runs([e.experiment_id])))
Q
)
say 9 "SIGTERM on a Ray sweep: rc $rc, statuses $st, stderr: $(cut -c1-60 ray.err | tail -1)" "$([ $rc = 143 ] && echo PASS || echo CHECK)"
$OVQ sweep cfg.yaml --grid 'seed=0;1' --name raysweep --out out checkpoint.dir=ck/ray meta_train.steps=400 > ray2.out 2> ray2.err; rc=$?
say 10 "restarted sweep: rc $rc; $(grep -c 'resuming\|reusing' ray2.err) trials resumed or reused" "$([ $rc = 0 ] && echo PASS || echo FAIL)"
# 11-16. bad input: one line, nothing created
mkdir -p bad; cd bad; cp ../cfg.yaml .; echo "raise RuntimeError('x')" > praise.py; echo "def f(:" > psyn.py; echo "import not_there_xyz" > pdep.py
for args in "model.layers=[ovq" "--plugin praise" "--plugin psyn" "--plugin pdep" "model.d_model=33"; do
  $OVQ run cfg.yaml $args > o 2> e; rc=$?; left=$(ls | grep -v '^\(cfg.yaml\|praise.py\|psyn.py\|pdep.py\|o\|e\|__pycache__\)$' | tr '\n' ' ')
  say 11 "bad: '$args': rc $rc, $(wc -l < e) line, left: '${left}': $(cut -c1-70 e)" "$([ $rc = 2 ] && [ $(wc -l < e) = 1 ] && [ -z "$left" ] && echo PASS || echo FAIL)"
done
$PY -m torch.distributed.run --nproc_per_node 2 -m experiments.cli run cfg.yaml model.d_model=33 > o 2> e; rc=$?
say 12 "torchrun bad input: rc $rc, our lines: $(grep -c '^ovq-cl\|^\[rank' e), launcher lines $(wc -l < e)" "$([ $(grep -c '^ovq-cl\|^\[rank' e) = 1 ] && echo PASS || echo FAIL)"
cd ..
# 13. quiet
$OVQ run cfg.yaml --quiet progress=true tracking.tracking_uri=sqlite:///q.db checkpoint.dir=ck/q > q.out 2> q.err
say 13 "--quiet progress=true on a new store: stderr bytes $(wc -c < q.err)" "$([ -s q.err ] && echo FAIL || echo PASS)"
$OVQ sweep cfg.yaml --grid 'seed=0;1' --name qs --out qs --quiet tracking.tracking_uri=sqlite:///q.db checkpoint.dir=ck/q > qs.out 2> qs.err
say 14 "sweep --quiet: table on stdout: $(grep -c '| all runs' qs.out), stderr bytes $(wc -c < qs.err)" "$(grep -q '| all runs' qs.out && [ ! -s qs.err ] && echo PASS || echo FAIL)"
$OVQ demo --steps 20 --mixers ovq,linear > demo.out 2> demo.err
say 15 "demo into a log: stderr lines $(wc -l < demo.err), carriage returns $(tr -cd '\r' < demo.err | wc -c)" "$([ $(tr -cd '\r' < demo.err | wc -c) = 0 ] && echo PASS || echo FAIL)"
$OVQ state-sizes --budget 16960 --d-model 64 > ss.out 2> ss.err; rc=$?
say 16 "state-sizes --budget 16960 --d-model 64: rc $rc; vq row: $(grep '^ *vq' ss.out | cut -c1-60); --as-demo vq: $($OVQ state-sizes --as-demo | grep '^ *vq' | tr -s ' ' | cut -c1-50)" "$([ $rc = 0 ] && echo PASS || echo FAIL)"
