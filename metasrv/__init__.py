"""metasrv: the control plane that purges a database's Kafka-based remote WAL."""

from metasrv.errors import MetasrvError
from metasrv.settings import Settings, load_settings

__all__ = ["MetasrvError", "Settings", "load_settings"]
