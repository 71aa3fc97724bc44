"""One module per scenario; each exposes `run(session, args) -> dict` and prints its own table."""
