"""`metasrv topics resolve-reset TOPIC --topic-id ID` (also spelled `metasrv topic
resolve-reset`): the operator's action on a topic reset (DESIGN §2 invariant 8), over
`POST /v1/topics/{topic}/resolve-reset`."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

import typer

from cli._connect import JsonOpt, connected, read
from cli._sheet import Output
from metasrv import wire
from metasrv.wire import MetasrvClient


@connected(write=True)
def resolve_reset(
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    topic_id: Annotated[
        str,
        typer.Option(
            "--topic-id",
            help="Kafka's current id of the topic (kafka-topics.sh --describe prints it).",
        ),
    ],
    as_json: JsonOpt = False,
    *,
    client: MetasrvClient,
) -> None:
    """Resolve a topic reset (the topic was deleted and recreated, or truncated).

    Clears the topic's marker, records TOPIC_ID, and makes every region of it report
    again. First make sure each of its regions replays from the new topic (its datanode
    rebuilt it from its own storage)."""
    request = wire.ResolveReset(topic_id=topic_id)
    path = f"/v1/topics/{quote(topic, safe='')}/resolve-reset"
    done, body = read(client, wire.ResetResolved, "POST", path, payload=request)
    out = Output()
    if as_json:
        out.json(body)
    else:
        out.line(
            f"topic {done.topic}: reset resolved ({done.reset_reason}); marker cleared "
            f"(was {done.previous_pruned_entry_id}), topic id {done.topic_id} recorded; "
            f"{done.regions} region(s) must report again before it is purged"
        )
