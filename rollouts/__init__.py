"""Rollouts: the model registry, deployments and how what runs changes."""
