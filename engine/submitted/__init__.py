"""Submitted jobs: placement (engine/submitted/placement.py) and the staged fan-out, driven by
provision_job (engine/submitted/provision.py)."""
