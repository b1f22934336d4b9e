"""Unified training (Primus §1.3): models, the trainer, modes, prioritisation, checkpoints.

* ``models``     -- hashed embeddings, the single-tower baseline and MTRM (memory + adapt tower);
                    :func:`model_inputs` of a data-plane :class:`~primus_dagster.data.Batch`
* ``trainer``    -- one optimisation step per micro-batch, routed by kind (batch / stream)
* ``metrics``    -- AUC / log loss of a model on held-out batches
* ``evaluation`` -- next-hour evaluation: the hours right after a training window
* ``priority``   -- mixture data prioritisation ``p_i = w_i * sigmoid(q_i)`` (a reader ``choose_queue``)
* ``modes``      -- batch, stream, batch_then_stream, mixed as phases of tasks
* ``checkpoint`` -- model + optimizer + data progress (driver barrier snapshot) + source versions
* ``tracking``   -- MLflow: params, per-step metrics, checkpoints as artifacts, resume, the model
* ``distributed``-- DDP trainer groups in lock-step rounds
* ``job``        -- a whole training job: plan, data plane, reader, modes, checkpoints, evaluation

Training reads data only through ``primus_dagster.data``'s public names and imports no Dagster;
``primus_dagster.dagster_defs`` wraps :func:`~primus_dagster.training.job.train_window`.
"""
