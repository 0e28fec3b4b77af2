"""Task definitions: data generators, models and losses, each seeded from an explicit
``torch.Generator``. ``TASKS`` maps a task name (as written in a grid file) to its task object."""

from .mqar import MQARConfig, MQARModel, MQARTask
from .retrieval import RetrievalConfig, RetrievalModel, RetrievalTask

TASKS = {"retrieval": RetrievalTask(), "mqar": MQARTask()}

__all__ = ["TASKS", "MQARConfig", "MQARModel", "MQARTask", "RetrievalConfig", "RetrievalModel", "RetrievalTask"]
