"""Kompaktor's Kubernetes operator: custom resources, reconcile, autoscaling decisions."""
