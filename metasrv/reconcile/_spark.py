"""Building the Spark session a reconcile run uses, telling a dead master apart, and the
Spark schemas of the job's Parquet, derived from the Arrow schemas that define them."""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from metasrv.errors import Unavailable

logger = logging.getLogger(__name__)

_LOG4J = Path(__file__).with_name("log4j2.properties")

DEFAULT_CONF: Mapping[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    # Few, fat partitions: the job's shuffles are at most a few million rows.
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.parquet.compression.codec": "zstd",
    "spark.sql.execution.arrow.pyspark.enabled": "false",
}


_SPARK_TYPES: Mapping[pa.DataType, T.DataType] = {
    pa.int64(): T.LongType(),
    pa.int32(): T.IntegerType(),
    pa.string(): T.StringType(),
    pa.bool_(): T.BooleanType(),
}


def spark_schema(*parts: pa.Schema | pa.Field) -> T.StructType:
    """The Spark schema of `parts` (schemas and single fields, in order): the same names,
    types and nullability. A timestamp with a time zone is Spark's `TimestampType` (an
    instant); an Arrow type without a Spark twin here is a `TypeError`."""
    fields: list[pa.Field] = []
    for part in parts:
        fields.extend(part if isinstance(part, pa.Schema) else [part])
    return T.StructType([T.StructField(f.name, _spark_type(f), f.nullable) for f in fields])


def _spark_type(field: pa.Field) -> T.DataType:
    arrow = field.type
    if pa.types.is_timestamp(arrow) and arrow.tz is not None:
        return T.TimestampType()
    spark = _SPARK_TYPES.get(arrow)
    if spark is None:
        raise TypeError(f"no Spark type for Arrow {arrow} (column {field.name})")
    return spark


def check_master_reachable(master: str, timeout: float = 3.0) -> None:
    """Fail fast, naming the master, when a `spark://` master does not accept connections.

    Spark itself retries registration for about a minute and then hangs or dies with a
    stack trace; a TCP probe of every listed host gives the operator a clear error.
    """
    if not master.startswith("spark://"):
        return
    hosts = master.removeprefix("spark://").split(",")
    errors: list[str] = []
    for hostport in hosts:
        parts = urlsplit(f"//{hostport}")
        host, port = parts.hostname or "", parts.port or 7077
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return
        except OSError as exc:
            errors.append(f"{host}:{port}: {exc}")
    raise Unavailable(f"Spark master {master} is unreachable ({'; '.join(errors)})")


def _master_conf(master: str) -> dict[str, str]:
    """Settings a cluster master needs from the driver's side.

    Executors connect back to the driver: on a master bound to loopback (the local
    stack's) the driver must listen there too, or it advertises the host name. Executors
    run Python, if at all, with the driver's interpreter only when they share its machine.
    """
    if not master.startswith("spark://"):
        return {}
    hosts = [urlsplit(f"//{h}").hostname or "" for h in master.removeprefix("spark://").split(",")]
    if all(h in ("127.0.0.1", "localhost", "::1") for h in hosts):
        return {
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.pyspark.python": sys.executable,
        }
    return {}


def build_session(
    master: str,
    *,
    app_name: str = "metasrv-reconcile",
    driver_memory: str = "4g",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Get or create the session for `master` with the job's defaults.

    `driver_memory` only takes effect when this call starts the JVM (the first session
    of the process). Raises `Unavailable` naming the master when it cannot be reached.
    """
    check_master_reachable(master)
    log4j = os.environ.get("METASRV_SPARK_LOG4J", str(_LOG4J))
    java_opts = f"-Dlog4j2.configurationFile=file:{log4j}"
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.driver.memory", driver_memory)
        .config("spark.driver.extraJavaOptions", java_opts)
        .config("spark.executor.extraJavaOptions", java_opts)
    )
    for key, value in {**DEFAULT_CONF, **_master_conf(master), **(conf or {})}.items():
        builder = builder.config(key, value)
    try:
        return builder.getOrCreate()
    except Exception as exc:  # py4j and the JVM launcher raise plain exceptions
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise Unavailable(f"could not start Spark with master {master}: {first}") from exc
