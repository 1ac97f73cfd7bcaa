"""Benchmarks of speed and memory (run as ``python -m benchmarks.<name>``; never part of the tests).

Run them on an otherwise idle machine. With as many busy processes as cores, OpenMP's default
spin-waiting makes multi-threaded torch ops stall whenever a sibling thread is descheduled (an OVQ
layer streaming 4k tokens took 24 s instead of 0.25 s under a load of 3.5 on 2 cores); there,
``OMP_WAIT_POLICY=PASSIVE`` or ``--threads 1`` gives usable numbers, but on an idle machine PASSIVE
makes OVQ's many small per-chunk ops about 2x slower (threads sleep between them), so it is not
the default. The policy in effect is printed with the machine. The OVQ chunk loop has its own
thread policy (``ovq_cl.ops.ovq.threads``: single-threaded while other processes hold cores);
``python -m benchmarks.contention`` measures it beside competing processes.
"""
