"""Kafka error codes and the exceptions that carry them."""

from kio.schema.errors import ErrorCode

__all__ = ["ErrorCode", "KafkaError"]


class KafkaError(Exception):
    """An error a client caused or must see, with the Kafka error code it maps to."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code

    def __str__(self) -> str:
        return f"{self.code.name.upper()}: {self.args[0]}"
