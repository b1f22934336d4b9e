"""Unified training (Primus §1.3): models, the trainer, modes, prioritisation, checkpoints.

* ``features``   -- :class:`Features` (torch tensors) from reader batches / canonical Arrow data
* ``models``     -- hashed embeddings, the single-tower baseline and MTRM (memory + adapt tower)
* ``evaluation`` -- AUC / log loss of a model on held-out batches
* ``priority``   -- mixture data prioritisation ``p_i = w_i * sigmoid(q_i)`` (a reader ``choose_queue``)
* ``checkpoint`` -- model + optimizer + data progress (driver barrier snapshot) + source versions
* ``tracking``   -- MLflow: params, per-step metrics, checkpoints as artifacts, resume, the model
* ``trainer``    -- one optimisation step per batch, routed by kind (batch / stream)
* ``job``        -- a whole training job: plan, data plane, reader, modes, checkpoints, evaluation

The engine imports no Dagster; ``primus_dagster.dagster_defs`` wraps :func:`run_training_job`.
"""
