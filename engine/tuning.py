"""The engine's fixed tuning values, each with the reason for it; what an operator may change is a
setting (settings.MUSTER), not here.

Batches bound one statement and one claim, so a worker holds few rows at once and a long batch
never outlives its lease; thread counts bound the SSH connections one task opens at a time.
"""

from __future__ import annotations

# -- the sweep (engine/sweeps.py) --
# rows per kind the sweep re-sends messages for in one pass: a burst of lost messages is caught up
# over a few passes instead of one pass queueing thousands
SWEEP_BATCH = 500
# above this many queued messages the workers are behind: a row's own message is late, not lost,
# and a copy would only lengthen the line (and the next sweep would add another)
SWEEP_BACKLOG = 100
# TPU slices being created whose lost poll the sweep sends again in one pass (engine/pods.py)
POD_BATCH = 200

# live TPU pods one watch tick claims (engine/pod_watch.py): one TPU API list per zone and fleet
# covers them all, so a batch is a few calls however many pods it holds
POD_WATCH_BATCH = 500
# attach grants due for removal one revoke step claims on one host (engine/attach_revokes.py):
# one SSH command removes them all
REVOKE_BATCH = 200

# -- watching running jobs (engine/running/watch.py) --
# jobs one claim takes: one status command per host, so a batch is one round of SSH calls
WATCH_BATCH = 200
# hosts looked at in parallel by a worker process's watch (its look threads, kept between batches)
WATCH_THREADS = 16

# -- the messages a batch step gathers (engine/messages.py `gathered`) --
# jobs one advance_jobs message names (the starts one step asks for: a look's runs, a gang, the
# peers a watch batch woke). Their first looks go out in parallel (the watch's threads), the
# hand-offs one job after another as the answers come, so this bounds how long the last of them
# waits on the hand-offs before it; the worker's processes take the messages in parallel.
ADVANCE_BATCH = 8
# jobs one finish_jobs message names (the ends a watch batch saw, a run's teardown). Its step asks
# their runners at once, then stops and cleans up each job on its host as its answer comes, so
# this bounds how long the last of them waits on the cleanups before it.
FINISH_BATCH = 25
# runs one process_runs message names (the runs of the jobs one finish_jobs step ended)
RUN_BATCH = 50
GATHERED = {"advance_job": ADVANCE_BATCH, "finish_job": FINISH_BATCH, "process_run": RUN_BATCH}

# -- the SSH health check of idle hosts (engine/ssh_health.py) --
HEALTH_BATCH = 200
HEALTH_THREADS = 16
# seconds a health check waits for `docker info` (given 10 s on the host itself) before keeping what it knew
DOCKER_PROBE_TIMEOUT = 15.0

# -- SSH registration (engine/ssh_registration.py) --
# hosts of one fleet contacted at once (connect, probe, runner start), and runners stopped at once
# after a refused registration: a fleet of hundreds is done in a few rounds without a thread each
REGISTER_THREADS = 32

# -- stopping (engine/groups.py, engine/finishing.py) --
# seconds at most between tries of a slice's delete the cloud keeps refusing: the wait doubles from
# one lease per failure up to this, so a delete that cannot succeed (credentials revoked) costs one
# call every ten minutes, not two a second, and is still tried again by itself once it can
DELETE_BACKOFF_MAX = 600.0
# hosts whose runner agent is asked to exit in parallel when a group goes
STOP_THREADS = 16
# seconds: a runner acts on a stop within its watch interval (0.1 s) and the job's stop grace; most
# jobs (servers, shells) exit on SIGTERM at once, so the stop is checked again after this
STOP_RECHECK = 0.25
# seconds: a job still running this long after its stop ignores SIGTERM or takes its grace
# (stop_duration, five minutes by default) to finish: looked at this often from then on
STOP_RECHECK_SLOW = 2.0

# -- starting (engine/starting/advance.py) --
# seconds: a runner that accepted a job starts it within one agent poll (0.2 s) plus a process
# start, so a submitted job is looked at again this soon rather than a whole poll interval later
STARTING_RECHECK = 0.25

# -- placement (engine/submitted/provision.py: the no-capacity failure) --
# characters of a no-capacity explanation kept on the job: the whole of it for any real project,
# while a run with thousands of groups cannot make every job row (and API answer) megabytes long
NO_CAPACITY_MESSAGE_LIMIT = 4000

# seconds: the longest a replica taken out of a service's pool keeps running before its stop, whatever
# MUSTER_DRAIN_DELAY says: a drain holds a host and a rolling update's next step, and a request still
# running after ten minutes is a stream the stop's grace period ends anyway
MAX_DRAIN_DELAY = 600.0

# -- PD services' routers (engine/router_sync.py, engine/replicas/keep.py) --
# seconds: one call to a router's worker API or a worker's /server_info (both answer at once when
# healthy; a hung one must not hold the run's sync), and the caps on what each may answer: a worker
# list of thousands of entries, an acknowledgement, an SGLang server's info (dstack's own caps)
ROUTER_CALL_TIMEOUT = 10.0
ROUTER_LIST_CAP = 2 * 1024 * 1024
ROUTER_ACK_CAP = 64 * 1024
WORKER_INFO_CAP = 256 * 1024
# seconds: a router still draining a removed worker is looked at again this soon, so a drained
# replica waiting for it (keep.py) stops soon after the router let it go
ROUTER_RECHECK = 2.0
# seconds a router may take to take a worker it accepted (smg checks it first: a healthy one is taken
# in well under a second) before the sync says the router does not take it
ROUTER_TAKE_WAIT = 30.0
# seconds: a ready router not yet routable (serving/router_sync.py `serves`) that a sync just gave a
# worker, or that lists one it has not taken yet, is synced again this soon (smg takes an added worker
# within a second); otherwise the beat's sweep and the ready set's moves look again
ROUTER_ROUTABLE_RECHECK = 0.5
# seconds past its drain delay a drained worker waits for its routers to stop listing it before it is
# stopped anyway (a router that never answers must not hold a host, nor a rolling update, for ever)
ROUTER_DRAIN_WAIT = 30.0
# a router's answers are the user's code: at most this many removals (each a call, and an event for a
# worker Muster registered) per router per sync, the rest left for the next; and all of one sync's
# calls within ROUTER_SYNC_BUDGET seconds (a router left unasked keeps what it listed before)
ROUTER_REMOVALS_PER_SYNC = 20
ROUTER_SYNC_BUDGET = 60.0
# -- queue-depth scaling (engine/replicas/queue_depth.py) --
# seconds one replica has to answer its /metrics: a gauge page is tens of kB served from memory
SCRAPE_TIMEOUT = 3.0
# seconds for all of one run's scrapes at a tick (done before the run is claimed: process_run never
# waits on them): a group of many replicas that all hang costs the tick this, and the rest are left
# out of that tick's average
SCRAPE_TICK_BUDGET = 20.0
# replicas of one run scraped at once: one that hangs costs its own SCRAPE_TIMEOUT, not the others'
# share of the budget; a few threads, since a worker's process has other steps to run
SCRAPE_PARALLEL = 8
# seconds between two events of one replica's failing scrape: said, not repeated every tick
SCRAPE_FAILURE_EVENT_EVERY = 300.0

# admit_fleet (engine/admission.py): how long the jobs a look woke are counted as taking their hosts
# (their provisioning steps normally place them within a second); a woken job still waiting after
# this did not fit, and is passed over by the looks until its own recheck (MUSTER_WAITING_HOST_RECHECK)
ADMISSION_PROMISE_SECONDS = 5.0
# a job the look chose but could not claim (its own provisioning step held it, a recheck that may be
# taking the hosts itself): how long its hosts stay its before the next look offers them again
ADMISSION_HELD_SECONDS = 0.5
# a look whose claim found the row locked by a release counting on it, or that placed a run on
# another fleet, is sent again this soon
ADMISSION_RETRY_SECONDS = 0.05
# how long a release waits for others before its look (the first release since the last look sends it):
# releases come one at a time (one finish_job each), and a look costs about as much whether it places one
# run or ten, so a burst's releases are looked at together at the cost of this much release-to-placed
ADMISSION_GATHER_SECONDS = 0.25
# how many waiting jobs a look reads at most, beyond one per idle host and per promise
ADMISSION_READ_MARGIN = 64
# idle hosts the look's runs placed together read past what they need (engine/submitted/together.py):
# some may be another step's by the time they are locked, and a run left without one is attempted
# alone, at twenty statements
TOGETHER_EXTRA_HOSTS = 8
# waiting jobs the sweep looks at on their own per sweep (every MUSTER_SWEEP_INTERVAL, 2 s): 10 a
# second at most, whatever the queue's depth; hosts given back reach waiting runs through their fleet's
# admission look (engine/admission.py), so these looks are the backstop (a host added, a lost look, a
# wait's end), and one per waiting run every minute at a depth of 10,000 kept the worker from the
# jobs' ends (bench.queueing)
SWEEP_RECHECK_BATCH = 20
