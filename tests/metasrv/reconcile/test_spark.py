"""`spark_schema`: the Spark schemas the job reads with are the Arrow schemas' twins."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from metasrv.reconcile import FINDINGS_SCHEMA, MAP_SCHEMA, spark_schema
from metasrv.stat_history import SNAPSHOTS_SCHEMA, STATS_SCHEMA


@pytest.mark.parametrize("arrow", [MAP_SCHEMA, FINDINGS_SCHEMA, STATS_SCHEMA, SNAPSHOTS_SCHEMA])
def test_every_column_keeps_its_name_order_and_nullability(arrow: pa.Schema) -> None:
    spark = spark_schema(arrow)
    assert spark.fieldNames() == arrow.names
    assert [f.nullable for f in spark.fields] == [f.nullable for f in arrow]


def test_types_and_extra_fields() -> None:
    arrow = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            pa.field("at", pa.timestamp("ms", tz="UTC"), nullable=False),
            pa.field("name", pa.string()),
            pa.field("ok", pa.bool_(), nullable=False),
        ]
    )
    spark = spark_schema(arrow, pa.field("hour", pa.int32(), nullable=False))
    assert spark == T.StructType(
        [
            T.StructField("id", T.LongType(), False),
            T.StructField("at", T.TimestampType(), False),
            T.StructField("name", T.StringType(), True),
            T.StructField("ok", T.BooleanType(), False),
            T.StructField("hour", T.IntegerType(), False),
        ]
    )


@pytest.mark.parametrize("arrow", [pa.timestamp("ms"), pa.float64(), pa.int16()])
def test_a_type_without_a_twin_is_refused(arrow: pa.DataType) -> None:
    with pytest.raises(TypeError, match="column c"):
        spark_schema(pa.field("c", arrow))
