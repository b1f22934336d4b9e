"""primus_dagster: unified batch/stream training of recommendation models, Dagster-native."""

__version__ = "0.1.0"
