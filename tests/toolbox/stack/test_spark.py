"""The `spark` fixture runs real local Spark jobs."""

from __future__ import annotations

from typing import Any


def test_local_aggregation_counts_and_maxes_per_key(spark: Any) -> None:
    from pyspark.sql import functions as F

    rows = [(f"topic-{i % 3}", i) for i in range(30)]
    df = spark.createDataFrame(rows, ["topic", "entry_id"])
    got = {
        r["topic"]: (r["n"], r["high"])
        for r in df.groupBy("topic")
        .agg(F.count("*").alias("n"), F.max("entry_id").alias("high"))
        .collect()
    }
    assert got == {"topic-0": (10, 27), "topic-1": (10, 28), "topic-2": (10, 29)}
    assert spark.sparkContext.master == "local[2]"
