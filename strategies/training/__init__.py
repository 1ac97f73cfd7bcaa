"""Training machinery the strategies share: one step (:mod:`.step`), meta-training (:mod:`.meta`),
checkpoints and RNG state (:mod:`.checkpoint`) and data parallelism under torchrun (:mod:`.distributed`)."""
