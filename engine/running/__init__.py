"""Running jobs: watch_running (engine/running/watch.py), the batch watch of every running job."""
