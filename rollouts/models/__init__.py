from .deployments import Deployment
from .loads import ModelLoad, ModelLoadEvent
from .registry import Alias, Model, ModelVersion

__all__ = ["Alias", "Deployment", "Model", "ModelLoad", "ModelLoadEvent", "ModelVersion"]
