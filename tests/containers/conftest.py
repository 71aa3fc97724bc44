from tests.containers.docker_env import docker_cluster  # noqa: F401
