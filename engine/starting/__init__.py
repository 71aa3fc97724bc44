"""Starting jobs: advance_job (engine/starting/advance.py) takes a placed job from `provisioning`
through `pulling` to `running`."""
