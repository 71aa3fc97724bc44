"""The engine: the claimed steps that move runs, jobs, instance groups and hosts along.

Each step is `claims.claimed(Model, pk, name, body)`: the body does its work and returns an Outcome
(the status it left the row in, what it learned and the events that say so, the next messages), which
claims.py applies in one guarded UPDATE (with those events, in its transaction) before the messages
leave after commit (engine/messages.py; a job's outcome:
engine/job_outcome.py). engine/tasks.py holds the Celery tasks, one thin wrapper per step. The chain of a run, in order (folder = the status of the row it moves):

claims        engine/claims.py                   claimed: the claim, the body's Outcome applied in one guarded UPDATE
                                                 (the lease columns: here, locked_claims.py and muster/claimable.py only)
              engine/outcome.py                  Outcome: what a body leaves to apply (fields, events, a move, follow-ups)
              engine/locked_claims.py            the claim protocol's own statements, written once per shape (its rows module)
              engine/nudges.py                   which job moves nudge their run: the rules the transition functions call
              engine/tuning.py                   the engine's fixed batch sizes and thread counts, each with its reason
              engine/messages.py                 every message, after commit; gathered: a batch's into a few
              engine/job_hosts.py                with_fleets: a batch's hosts' fleets and slices, read once
              engine/errors.py                   Refused: what a step refuses, in the {loc, msg} shape, none of the API's types
submit        runs/services/submission.py        submit_run, then messages.provision_job for job 0
submitted     engine/submitted/provision.py      provision_job: claim a submitted job, place it, unlock the next;
                                                 recheck_jobs: the sweep's rechecks of waiting jobs, one batch
  placement   engine/submitted/placement.py      take_instances, take_gang_across: the hosts each group gets
  gang        engine/submitted/gang.py           release: a slice that cannot be had hands the static hosts back
  waiting     engine/submitted/waiting.py        wait, hand_back: a run on a full fleet waits for hosts given back
  admission   engine/admission.py                admit_fleet: one look per fleet wakes the waiting runs its idle
                                                 hosts go to (runs/admission.py chooses)
              engine/submitted/together.py       place_together: the look's runs alike placed in one transaction
  preemption  engine/submitted/preemption.py     preempt_for, choose: a waiting higher priority stops preemptible runs
              engine/submitted/reclaim.py        reclaim_for: a project owed its quota stops borrowers' preemptible runs
  fan-out     engine/submitted/fanout.py         unlock_after_attempt, place_members: the staged master unlock
  replicas    engine/submitted/replica_placement.py place_replica: a service's replica takes its host(s) on its own
              engine/submitted/replica_groups.py place: a replica that is a group its backend creates (a TPU slice)
  fitting     instances/fitting.py               first_fitting_fleet, explain: which fleet fits, why none does
              instances/spanning.py              choose: the fleet of each group (read-only; the plan reads both)
  pods        engine/pods.py                     reserve_pod: a group its backend creates (a TPU slice), then poll_pod
starting      engine/starting/advance.py         advance_job: runner up, peers known, start order, hand-off;
                                                 advance_jobs: the starts one step asked for together, one step
  spec        engine/starting/cluster.py         runner_spec: what a job is told when it starts
  ordering    engine/starting/ordering.py        what a job waits for: startup_order and depends_on
  containers  engine/starting/containers.py      show_pull_progress, container_end: an image job's pull
running       engine/running/watch.py            watch_running: the batch watch of running jobs
  observe     engine/running/observe.py          look, watch_observed: a runner's answer acted on (start, end)
  readiness   engine/running/readiness.py        when a running job is ready, from its probes
  looks       engine/runner_status.py            read, checked: a runner's status, checked before use
stopping      engine/finishing.py                finish_job: stop on the host, copy the log, give the host back;
                                                 finish_jobs: the ends one step saw (a watch batch, a teardown)
runs          engine/processing.py               process_run: a run's status derived from its jobs (retry, teardown);
                                                 process_runs: the runs of one finish_jobs step, one step
  failures    engine/failure_policy.py           what a failed job means under its group's on_failure
  restarts    engine/restarts.py                 a group's nodes restarted as a new submission, the others run on
services      engine/replicas/keep.py            keep: a service's derive: failed replicas replaced, the count kept
                                                 at desired_replicas, a rolling update surged one at a time, drains
              engine/replicas/rows.py            replace, add, drain, leave_pool: the replica rows it writes
              engine/replicas/revisions.py       a routed service's blue/green update: switch, roll_back
              engine/replicas/nodes.py           a multi-host replica (nodes: N) stopped and restarted as one
              engine/replicas/scaling.py         scale_service: desired_replicas from the endpoint's rps (beat)
              engine/router_sync.py              sync_routers: a PD service's smg routers list its ready workers
                                                 (nudged on readiness changes; sweep_routers from beat)
              engine/replicas/queue_depth.py     ... or from the queue gauge the group's replicas serve
groups        engine/groups.py                   terminate_group: delete an instance group with its backend;
                                                 stop_agents: the one fan-out that stops runner agents
pods          engine/pods.py                     poll_pod: a slice being created or deleted, polled again
  watch       engine/pod_watch.py                watch_pods: live groups at their provider; one taken back ends its jobs
              engine/slice_replace.py            (called by it) one lost slice of a replace-slice set made again, the rest kept
fleets        engine/registration.py             register_fleet: a pending SSH fleet's hosts contacted, activated or failed
              engine/ssh_registration.py         complete_registration: the contacting, probing and runner starts;
                                                 stop_registered_agents: a gone fleet's agents, stopped after commit
              engine/fleet_deletion.py           delete_fleet: a terminating fleet's hosts stopped and ended, the fleet removed
health        engine/health.py                   mark_unreachable, mark_reachable (record_seen: a batch's), stop_orphans
              engine/ssh_health.py               check_ssh_hosts: idle SSH hosts checked by the sweep
attach keys   engine/attach_installs.py          install_attach_key: a user's attach line put on the job's host
              engine/attach_revokes.py           revoke_attach_keys: a host's attach lines that are due, removed
sweeps        engine/sweeps.py                   sweep: send again the message of any row whose own seems lost
logs          engine/log_copy.py                 follow, take, keep_copy: a job's log copied to the server as it runs and ends

The engine does all host I/O (log copy: engine/log_copy.py; attach installs and revokes; the Docker
probe; SSH registration; agent stops). It imports the tables below it (models, choices, transitions, and the
read-only modules beside them) and never the app services, the API or the console above it;
tests/test_import_graph.py holds the layer rule.
"""
