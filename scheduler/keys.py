"""Every Redis key and channel name the project uses, in one place.

Keys of one model's queues share the hash tag `{model}` so they live in one Redis Cluster
slot; rate-limit buckets share `{rl}` so one Lua script may touch several of them. Admission's
enqueue script touches both tags (the rate limit and the queue in one round trip), so on Redis
Cluster a model's queue keys and `{rl}` would have to share a slot.
"""

from scheduler.generation import Tier

TIERS = tuple(Tier)  # claim order: VIP first, batch last
CONSUMER_GROUP = "workers"


def queue(model: str, tier: str) -> str:
    return f"llm:{{{model}}}:queue:{tier}"


def enqueue_seq(model: str, tier: str) -> str:
    """Counter stamped on each job at enqueue; with `claimed_seq` it gives queue positions."""
    return f"llm:{{{model}}}:enqueued:{tier}"


def claimed_seq(model: str, tier: str) -> str:
    return f"llm:{{{model}}}:claimed:{tier}"


# Fair share inside a tier (scheduler/fair_share.py): the consumer that holds a tier's jobs
# between their arrival and their claim, sorted into one backlog per source.
FAIR_SHARE_CONSUMER = "fair-share-backlog"


def fair_backlog_prefix(model: str, tier: str) -> str:
    """List per source (the prefix + the source id): the stream entry ids of its jobs waiting in
    the tier, oldest first. The claim script names these keys from the prefix."""
    return f"llm:{{{model}}}:fair:{tier}:backlog:"


def fair_counters(model: str, tier: str) -> str:
    """Sorted set: source id -> virtual tokens served in the tier (weighted prompt + output
    tokens); sources below the floor less the idle credit are forgotten (they would be lifted
    to it anyway), and past FAIR_SHARE_SOURCES_KEPT the least-served."""
    return f"llm:{{{model}}}:fair:{tier}:counters"


def fair_active(model: str, tier: str) -> str:
    """Sorted set: the sources with jobs waiting in the tier -> their virtual tokens served."""
    return f"llm:{{{model}}}:fair:{tier}:active"


def fair_floor(model: str, tier: str) -> str:
    """String: the least virtual tokens served of the tier's waiting sources, or the last one's
    to stop waiting (never lowered); a source that starts waiting again starts no lower than
    this less the idle credit."""
    return f"llm:{{{model}}}:fair:{tier}:floor"


def affinity_prefix(model: str) -> str:
    """String per conversation (the prefix + its id), expiring: the worker that claimed its
    latest turn, which the claim prefers for the next one. The claim script names these keys."""
    return f"llm:{{{model}}}:affinity:"


def capacity(model: str) -> str:
    """Hash: worker id -> "jobs/s all tiers|jobs/s normal|unix time", for wait predictions."""
    return f"llm:{{{model}}}:capacity"


def serving(model: str) -> str:
    """Sorted set: worker id -> last heartbeat of the model's workers that claim, the others
    being warm spares (see scheduler/warmpool.py)."""
    return f"llm:{{{model}}}:serving"


def arrivals(model: str, tier: str, bucket_start: int) -> str:
    """Counter: jobs admitted to the tier in the few seconds from `bucket_start` (expires)."""
    return f"llm:{{{model}}}:arrivals:{tier}:{bucket_start}"


def dead_letter(model: str) -> str:
    return f"llm:{{{model}}}:dead"


def result(model: str, request_id: str) -> str:
    """The request's event stream (queued, start, token, reset, done, error), replayable."""
    return f"llm:{{{model}}}:result:{request_id}"


def relay_wake(follower_id: str) -> str:
    """A web process's private stream: a new subscription writes to it to wake the follower."""
    return f"llm:relay:wake:{follower_id}"


def publisher_batch(publisher_id: str) -> str:
    """A worker's result publisher: the number of the last batch it wrote (retries skip it)."""
    return f"llm:publisher:{publisher_id}:batch"


def cancel(request_id: str) -> str:
    return f"llm:cancel:{request_id}"


def bucket_user(client_id: str) -> str:
    return f"llm:{{rl}}:user:{client_id}"


def bucket_tier(tier: str) -> str:
    return f"llm:{{rl}}:tier:{tier}"


def bucket_address(address: str) -> str:
    return f"llm:{{rl}}:addr:{address}"


BUCKET_GLOBAL = "llm:{rl}:global"


def bucket_key_requests(client_id: str) -> str:
    """An API key's own requests-per-minute bucket (see scheduler/key_limits.py)."""
    return f"llm:{{rl}}:key-rpm:{client_id}"


def bucket_key_tokens(client_id: str) -> str:
    """An API key's own tokens-per-minute bucket."""
    return f"llm:{{rl}}:key-tpm:{client_id}"


def key_token_reservations(client_id: str) -> str:
    """Hash: request id -> tokens its admission took from the key's tokens bucket, until the
    worker settles them with what the answer used."""
    return f"llm:{{rl}}:key-tpm-reserved:{client_id}"


def login_failures_username(username_digest: str) -> str:
    """Counter: failed sign-ins for one username in the current window (expires with it)."""
    return f"llm:login:user:{username_digest}"


def login_failures_address(address: str) -> str:
    return f"llm:login:addr:{address}"


def inflight(client_id: str) -> str:
    """Sorted set: the client's unfinished request ids, scored by when they lapse at the latest."""
    return f"llm:{{rl}}:inflight:{client_id}"


def policy(tier: str) -> str:
    return f"llm:{{rl}}:policy:{tier}"


def watchers(model: str, request_id: str) -> str:
    """Hash: how many clients follow the request's stream, and since when none has."""
    return f"llm:{{{model}}}:watch:{request_id}"


WARM_SPARES = "llm:warm-spares"  # string: the console's number of warm spare workers per model
CANARY = "llm:canary"  # hash: the console's canary split (stable, candidate, split_percent, salt)
# Hash: the running A/B experiment (id, variant_a, variant_b, split_percent, salt); id "" for none.
EXPERIMENT = "llm:experiment"


def series_bucket(bucket_start: int) -> str:
    """Hash: the console's time series for the 10 s starting at this unix time (see timeseries)."""
    return f"llm:series:{bucket_start}"


def worker_heartbeat(worker_id: str) -> str:
    return f"llm:worker:{worker_id}"


WORKERS_INDEX = "llm:workers"  # sorted set: worker id -> last heartbeat (unix seconds)
CONTROL_CHANNEL = "llm:control"  # pub/sub: cancel and drain reach every worker

# The console's live dashboard: the channel-layer group its sockets join, and the key that lets one
# web process per period compute the snapshot for all of them.
CONSOLE_LIVE_GROUP = "console.live"
CONSOLE_LIVE_TURN = "llm:console:live-turn"  # string, expires: who computes this period's snapshot


# Hand-off to a person (chat.handoff). The database is the record; these are the delivery.


def conversation_events(conversation_id: str) -> str:
    """Stream: a conversation's hand-off events (agent joined, messages, typing, resolved...), for
    the customer's page and the agent's; entry ids are the SSE event ids."""
    return f"llm:conversation:{conversation_id}:events"


# Stream: "something in the inbox changed" (a hand-off asked for, claimed, ended, a message in
# one), which every open inbox socket follows to send its agent a fresh snapshot.
INBOX_EVENTS = "llm:inbox:events"
# Sorted set: "<agent id>:<tab id>" -> last heartbeat (unix s) of every open inbox tab.
AGENTS_PRESENCE = "llm:agents:presence"


def beat_sent(entry: str) -> str:
    """String, expires: when (Redis time) a Celery beat last sent this periodic task."""
    return f"llm:beat:{entry}"
