"""What a run measures: the metric registry and the loss (:mod:`.metrics`), the result matrix R and the
state's size (:mod:`.results`), forgetting (:mod:`.forgetting`), the learned gate (:mod:`.gate`), the
delay-recall curve (:mod:`.delay`) and the interference curves (:mod:`.interference`)."""
