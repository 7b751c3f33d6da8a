"""Service-level objectives: each deployment's SLO status, error budget and burn-rate alerts."""
