"""Task definitions: data generators, models and losses, each seeded from an explicit
``torch.Generator``. ``TASKS`` maps a task name (as written in a grid file) to its task object."""

from .retrieval import RetrievalConfig, RetrievalModel, RetrievalTask
from .shakespeare import ShakespeareConfig, ShakespeareTask

TASKS = {"retrieval": RetrievalTask(), "shakespeare": ShakespeareTask()}

__all__ = ["TASKS", "RetrievalConfig", "RetrievalModel", "RetrievalTask", "ShakespeareConfig", "ShakespeareTask"]
