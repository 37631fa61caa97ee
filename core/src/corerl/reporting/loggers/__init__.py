"""Experiment loggers (TensorBoard, Weights & Biases, MLflow): each a registration of its own
(:class:`corerl.registry.ExperimentLogger`) with a ``logger.<id>`` section."""
