"""Unified training (Primus §1.3): one window skeleton, two trainers, models, modes, prioritisation, checkpoints.

* ``window``         -- :func:`~primus_dagster.training.window.train_window`: plan, MLflow run, phases on data
                        planes, evaluation, the model -- for any :class:`~primus_dagster.training.window.PhaseTrainer`
* ``run_state``      -- what a run is asked (``TrainingRequest``, ``RunHooks``) and the state it keeps (``TrainingRun``)
* ``single_trainer`` -- one trainer in this process (``pools.training.replicas: 1``)
* ``rank_group``     -- N rank processes in lock-step rounds (``replicas: N``), on ``distributed``
* ``distributed/``   -- the rank mesh (transport), the gradient exchange, the rounds, how ranks are launched
* ``planning``       -- which tasks a window reads; what a run consumed (lineage)
* ``result``         -- ``TrainingResult``: what a run produced (the asset's metadata)
* ``quality_report`` -- data-quality counts of a run, per source and rule, and where
* ``models``         -- hashed embeddings, the single-tower baseline and MTRM (memory + adapt tower)
* ``trainer``        -- one optimisation step per micro-batch, routed by kind (batch / stream)
* ``metrics`` / ``evaluation`` / ``final_eval`` -- AUC and log loss; next-hour and delayed evaluation
* ``priority``       -- mixture data prioritisation ``p_i = w_i * sigmoid(q_i)``
* ``modes``          -- batch, stream, batch_then_stream, mixed as phases of tasks
* ``checkpoint``     -- model + optimizer + data progress (driver barrier snapshot) + source versions
* ``tracking``       -- MLflow: params, per-step metrics, checkpoints as artifacts, resume, the model
* ``progress``       -- stage lines and a heartbeat in the run log; the progress line
* ``live``           -- live stream increments on the Kafka tail

Training reads data only through ``primus_dagster.data``'s public names and imports no Dagster;
``primus_dagster.dagster_defs`` wraps :func:`~primus_dagster.training.window.train_window`.
"""
