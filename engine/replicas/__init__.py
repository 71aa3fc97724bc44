"""A service run's replicas, kept by the engine (docs/services.md, "Replicas, updates and scaling").

keep.py     what process_run does with a service instead of a task's derive: failed replicas
            replaced, the count kept at desired_replicas, a rolling update surged one at a time,
            removed replicas drained (out of the pool, then stopped), the run's status
rows.py     the replica rows it writes: a replacement (a new submission of the replica), a new
            replica (scale-up, update), a drain
revisions.py  a service with a router updated blue/green per deployment: the new one beside the
            serving one, the endpoint switched in one write once it is ready, rolled back if it fails
nodes.py    a multi-host replica (`nodes: N`) kept as one: a node ending stops the others, and all
            restart together (on the same hosts after an error)
scaling.py  scale_service: the claimed step that turns the endpoint's request count into
            desired_replicas (beat-driven, MUSTER_SCALING_INTERVAL)
"""
