from .deployments import Deployment
from .registry import Alias, Model, ModelVersion

__all__ = ["Alias", "Deployment", "Model", "ModelVersion"]
