"""An exhaustive model of the WAL purge protocol: a breadth-first search over every
interleaving of a small world, whose transitions call the product's real decisions.

Modules, in the order a search uses them:

- `_world.py`: the state (Kafka's topic with its incarnations and a consumer group's
  committed offset, the regions, the kv marker, routes and procedure record, the leader's
  term, settings (the group pinned or not), stats, map and running step, the writes in
  flight), the bounds, the known-bad `Variant`s and the marker a registration writes
  (`keys.registered_marker`).
- `_product.py`: the product's decision functions as the model calls them (`plan_topic`,
  `flush_candidates`, `decide_prepare`, `decide_after_flush`, `decide_purge`,
  `advanced_marker`, `reset_marker`, the marker codec, `replay_start_entry_id` behind the
  API's reset check, the datanode's `replay_from`, the judge's `regresses`), memoised.
- `_stats.py`: the planner's `TopicStats` over the model's stats.
- `_actions.py`: every transition and the safety invariants checked on it.
- `_liveness.py`: from every explored state, quiet transitions end the purge and a new one.
- `_search.py`: the search, traces, results.

Actions: a region writes (high watermark + 1), flushes, sees its memtable empty (an idle
claim), restarts (replay-start answered from the leader's stat, the checkpoint and the
marker) and replays (from `replay_from(answer, own flushed id)`; a consumer below Kafka's
log start fails); heartbeats carry any flushed id between the stored stat and the truth
(delayed, reordered, duplicated), with or without the idle claim; registration and
deregistration under the topic lock (a registration records Kafka's topic id in the marker,
`keys.registered_marker`); purges submitted and run step by step (each step one
transition that reads, decides with the real function, and acts); leader changes (stats
dropped, the map loaded from the kv, the record resumed); writes in flight landing at any
later time or never: a marker CAS (fenced: a deposed term's never lands), a DeleteRecords
(not fenced: Kafka has no fence), and with `UNFENCED_CHECKPOINT` a checkpoint; Kafka's log
start moved by retention, a record appended by another producer, the topic deleted and
recreated (a new topic id, offsets from 0), with or without regions; a consumer group
committing offsets, only forward, pinned (`[wal] pin_consumer_groups`) from the start or
by a later leader's settings; with the WAL archive, archivers writing objects of any range
Kafka holds ("archived up to": a bit per offset), independently of the group's commits.

Invariants, on every transition:
- needed entry deleted: metasrv's DeleteRecords removes an entry a registered region has
  not flushed (its memtable, or what its restart must replay);
- replay skips an entry: a replay-start answered above the region's first unflushed entry,
  unless the region itself said it had flushed past it (after a recreation a region's
  flushed id may name the old topic's offsets, which only the region could know);
- replay below the log start: the datanode's consumer starts below Kafka's log start,
  where metasrv deleted, although the region needs nothing below it (retention deleting
  under a region is WAL data loss, reported by the plan, not a protocol failure);
- deposed write landed: a kv write of a deposed term takes effect;
- pinned entry deleted: a DeleteRecords sent by a leader that pins the consumer group
  moves the log start past the group's committed offset (or deletes anything while the
  group has committed none): DESIGN §8's P' = min(P, committed offset);
- unarchived entry deleted: with the archive enabled, a DeleteRecords moves the log start
  past an entry no object of the bucket holds (invariant 10: nothing is deleted that is not
  archived);
- liveness (every explored state): once writes stop, every write in flight lands, and every
  region flushes and reports the truth, the purge in progress ends, no record that no task
  runs holds the topic's lock, no route of a region that no longer exists blocks the
  topic, and a new purge ends.

Bounds. `SMALL` (`make test`), each world 1 topic, explored whole:
- `purge`: 2 regions (the second registered later), high watermark <= 3, 3 leader terms,
  deregistration, no restarts, no idle claims: 103,348 states;
- `idle`: as `purge` with idle claims, high watermark <= 2, 2 terms: 61,333 states;
- `replay`: 2 regions, high watermark <= 2, 3 terms, restarts, replays, checkpoints:
  173,578 states;
- `kafka`: 1 region, high watermark <= 2, 2 terms, restarts, one outside move of the
  offsets and one recreation of the topic: 44,763 states;
- `pinned`: 2 regions, high watermark <= 3, 2 terms, registration, the consumer group
  pinned from the start: 78,008 states;
- `archive`: 1 region, high watermark <= 3, 3 terms, the archive enabled (its group pinned,
  committing apart from the objects written): 74,468 states;
- `IDLE_REPLAY`: idle claims with restarts (2 regions, high watermark <= 2, 2 terms);
- `PIN_LATER`: 1 region, high watermark <= 3, 3 terms, the group pinned by a later
  leader, so a purge planned without the pin is resumed under it: 76,013 states.
`LARGE` (the slow test, `benchmarks/protocol_model.py --bound large`): `purge` at high
watermark <= 4 (784,336 states, 82 s), `idle` and `replay` at high watermark <= 3 and 2
terms (1,200,315 states, 109 s; 2,300,210 states, 198 s; with 3 terms neither ends in 300 s),
`kafka` with 2 regions and high watermark <= 3 (the benchmark only). Their union in one
world is several million states (more than two minutes on two cores), so each world keeps
the actions its invariants need.

Not modelled: more than one topic (the purge and its locks are per topic), stale stats
(ttl), flush instructions (a region flushes whenever it likes, which covers them), the
archive's retention and a store that does not answer (the check's `NotArchived` without a
listing is the same skip), logical deletion. A DeleteRecords sent for one incarnation of the
topic and landing on the next one is off by default (`late_delete_across_reset`): Kafka's
DeleteRecords names the topic, not its id, so nothing metasrv does can fence it; the window
is one request.

States are deduped by their 64-bit hash (`_search.py`).
"""

from tests.procedures.wal_purge.protocol_model._search import Counterexample, Result, search
from tests.procedures.wal_purge.protocol_model._world import (
    IDLE_REPLAY,
    LARGE,
    PIN_LATER,
    SMALL,
    Bounds,
    State,
    Variant,
)

__all__ = [
    "IDLE_REPLAY",
    "LARGE",
    "PIN_LATER",
    "SMALL",
    "Bounds",
    "Counterexample",
    "Result",
    "State",
    "Variant",
    "search",
]
